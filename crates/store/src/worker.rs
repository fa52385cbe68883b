//! The thread of one shard: an event loop that owns some of the store's objects and some of
//! its connections (CHC §4.3 "datastore threads").
//!
//! One turn of the loop: wait for socket readiness or a message from another shard; read what
//! every ready connection sent and serve each whole frame ([`crate::conn`]): operations on
//! this shard's objects are applied at once, others are queued for their shard; take the
//! other shards' messages (operations to apply here, answers to merge, pushes to deliver);
//! sweep expired objects when due; write the turn's log records with one write (and
//! `fdatasync` with [`crate::Config::sync`]); only then queue the notifications and hand the
//! queued operations, answers and pushes to the other shards (one message per destination,
//! and one wake-up); and last write each connection's pending output with one `write`.
//! Nothing is sent to a client, and no answer leaves for another shard, before the log
//! records of the operations it acknowledges are written.

use crate::conn::{Conn, Parked, PartBody};
use crate::shard::{self, Objects, Sub};
use crate::wal::{Part, Wal};
use crate::{now, Shared};
use flowstate_objects::Spare;
use flowstate_proto::{Command, Failure, Kind, Message, Notification, Reply, Request, OP_NAMES};
use mio::{Events, Interest, Poll, Registry, Token};
use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// The token of a shard's waker (connections use their slot index).
pub(crate) const WAKER: Token = Token(usize::MAX);

/// A message to a shard thread.
pub(crate) enum Msg {
    /// A new connection to serve (from the accept thread).
    Conn {
        id: u64,
        stream: std::net::TcpStream,
    },
    /// Requests of connections of shard `from` on this shard's objects, in the order the
    /// connections sent them.
    Forward { from: usize, items: Vec<(u64, Fwd)> },
    /// This shard's connections' answers from another shard: (connection, request sequence
    /// number, part).
    Answers(Vec<(u64, u64, PartBody)>),
    /// Frames to push to this shard's connections (notifications).
    Pushes(Vec<(u64, Message)>),
    /// Shard `from` applied (and logged) its parts of these fenced batches (client, op id)
    /// whose fence is on this shard.
    Applied {
        from: usize,
        batches: Vec<(u64, u64)>,
    },
    /// A connection closed: drop its subscriptions.
    Disconnect(u64),
    /// Close every connection, write a final checkpoint and stop.
    Stop,
}

/// A request (or part of one) handed to the shard that owns its objects.
pub(crate) enum Fwd {
    Batch {
        seq: u64,
        client: u64,
        op_id: u64,
        ack_only: bool,
        /// Operations with their index in the frame.
        ops: Vec<(u32, Request)>,
        /// A fenced batch's parts on other shards, logged with this part (its fence's).
        rest: Vec<Part>,
        /// The shard of the fenced batch's fence, to be told once this part is logged.
        fence: Option<usize>,
    },
    Partitions {
        seq: u64,
        nf: Vec<u8>,
        kind: Kind,
        id: Vec<u8>,
    },
    Subscribe {
        seq: u64,
        key: Vec<u8>,
        instance: u32,
    },
    Unsubscribe {
        seq: u64,
        key: Vec<u8>,
    },
}

/// How often a shard sweeps expired objects (and so how late an expiry notification may be).
const TICK: Duration = Duration::from_millis(20);
/// Most bytes read from one connection in one turn (fairness between connections).
const READ_BUDGET: usize = 256 * 1024;
/// Size of a read.
const CHUNK: usize = 64 * 1024;
/// Most bytes written to one connection in one turn (fairness: megabytes of answers to one
/// client go out a piece per turn, between the others' requests).
const WRITE_BUDGET: usize = 256 * 1024;
/// How often a shard looks for connections past their handshake or idle time.
const REAP: Duration = Duration::from_millis(250);

pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) objects: Objects,
    pub(crate) wal: Option<Wal>,
    pub(crate) shared: Arc<Shared>,
    registry: Registry,
    pub(crate) subs: foldhash::HashMap<Vec<u8>, crate::shard::Subs>,
    /// Keys updated in this turn, with the connection that did it.
    pub(crate) touched: Vec<(Vec<u8>, u64)>,
    /// Round robin over subscribers for expiry notifications, spreading timer work over the
    /// instances (StatelessNF §4.1).
    next_expiry: usize,
    /// Connections by slot (the slot is the mio token).
    pub(crate) conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Slot of each connection of this shard, by connection id.
    by_id: foldhash::HashMap<u64, usize>,
    /// Connections to serve (again) in this turn: readable, or held back before.
    again: Vec<usize>,
    /// Connections to write to or to check for closing at the end of the turn.
    pub(crate) dirty: Vec<usize>,
    /// What goes to each other shard at the end of the turn.
    pub(crate) forwards: Vec<Vec<(u64, Fwd)>>,
    /// Fenced batches whose parts this shard applied, by the shard of their fence.
    pub(crate) applied: Vec<Vec<(u64, u64)>>,
    /// Fenced batches with their fence on this shard whose parts on other shards are not known
    /// to be logged yet, by (client, op id): those shards, and the batch's parts as a log record
    /// (written again into a new log at a checkpoint).
    open: foldhash::HashMap<(u64, u64), (Vec<usize>, Vec<u8>)>,
    answers: Vec<Vec<(u64, u64, PartBody)>>,
    pushes: Vec<Vec<(u64, Message)>>,
    /// Operations counted in this turn, added to the shared counters once per turn.
    pub(crate) op_counts: [u64; OP_NAMES.len()],
    /// Reused buffers.
    chunk: Vec<u8>,
    pub(crate) replies: Vec<(u32, Reply)>,
    pub(crate) parts: Vec<Vec<(u32, Request)>>,
    /// The operations of the batch being served (emptied between connections).
    pub(crate) batch_ops: Vec<Request<&'static [u8]>>,
    targets: Vec<(usize, u64)>,
    stop: bool,
}

impl Worker {
    pub(crate) fn new(
        index: usize,
        objects: Objects,
        wal: Option<Wal>,
        shared: Arc<Shared>,
        poll: &Poll,
    ) -> std::io::Result<Worker> {
        let n = shared.shards.len();
        Ok(Worker {
            index,
            objects,
            wal,
            registry: poll.registry().try_clone()?,
            shared,
            subs: Default::default(),
            touched: Vec::new(),
            next_expiry: 0,
            conns: Vec::new(),
            free: Vec::new(),
            by_id: Default::default(),
            again: Vec::new(),
            dirty: Vec::new(),
            forwards: (0..n).map(|_| Vec::new()).collect(),
            applied: (0..n).map(|_| Vec::new()).collect(),
            open: Default::default(),
            answers: (0..n).map(|_| Vec::new()).collect(),
            pushes: (0..n).map(|_| Vec::new()).collect(),
            op_counts: [0; OP_NAMES.len()],
            chunk: vec![0; CHUNK],
            replies: Vec::new(),
            parts: (0..n).map(|_| Vec::new()).collect(),
            batch_ops: Vec::new(),
            targets: Vec::new(),
            stop: false,
        })
    }

    pub(crate) fn run(mut self, mut poll: Poll, rx: Receiver<Msg>) {
        let cpus = &self.shared.config.cpus;
        if !cpus.is_empty() {
            crate::pin_to_cpu(cpus[self.index % cpus.len()]);
        }
        let mut events = Events::with_capacity(1024);
        let checkpoint_interval = self.shared.config.checkpoint_interval;
        let checkpoint_bytes = self.shared.config.checkpoint_bytes;
        let mut work = Vec::new();
        // The time of the current turn: one clock read per turn, for the operations (wall
        // clock: deadlines persist) and for the shard's own timers.
        let mut t = now();
        let (mut last_sweep, mut last_ckpt, mut last_reap) = (t, t, t);
        loop {
            // Sleep without a timer when nothing is timed: no deadline to sweep, nothing logged
            // to checkpoint.
            let timeout = if !self.again.is_empty() {
                Some(Duration::ZERO)
            } else {
                let sweep = (!self.objects.index.is_empty())
                    .then(|| TICK.saturating_sub(t.saturating_sub(last_sweep)));
                let ckpt = self
                    .wal
                    .as_ref()
                    .filter(|w| w.bytes > 0)
                    .map(|_| checkpoint_interval.saturating_sub(t.saturating_sub(last_ckpt)));
                let reap = (!self.by_id.is_empty())
                    .then(|| REAP.saturating_sub(t.saturating_sub(last_reap)));
                [sweep, ckpt, reap].into_iter().flatten().min()
            };
            if let Err(e) = poll.poll(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    tracing::error!("shard {}: poll: {e}", self.index);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            t = now();
            // A wall clock set back must not hold the timers back.
            last_sweep = last_sweep.min(t);
            last_ckpt = last_ckpt.min(t);
            last_reap = last_reap.min(t);
            for ev in events.iter() {
                if ev.token() == WAKER {
                    continue;
                }
                let slot = ev.token().0;
                let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                    continue;
                };
                if ev.is_writable() {
                    c.writable = true;
                    mark(&mut self.dirty, c);
                }
                if ev.is_read_closed() || ev.is_error() {
                    // Read to the end (or the error): no short-read shortcut.
                    c.hup = true;
                }
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    queue_slot(&mut self.again, c);
                }
            }
            while let Ok(m) = rx.try_recv() {
                self.message(m, t);
            }
            std::mem::swap(&mut work, &mut self.again);
            if !self.stop {
                // (A stopping shard takes no more requests.)
                for &slot in &work {
                    self.serve(slot, t);
                }
            }
            work.clear();
            if t.saturating_sub(last_sweep) >= TICK {
                last_sweep = t;
                self.objects.sweep(t);
            }
            if t.saturating_sub(last_reap) >= REAP {
                last_reap = t;
                self.reap(t);
            }
            self.commit(t);
            self.send_out();
            self.write_out();
            let wal_full = self
                .wal
                .as_ref()
                .is_some_and(|w| w.bytes >= checkpoint_bytes);
            if self.stop || wal_full || t.saturating_sub(last_ckpt) >= checkpoint_interval {
                last_ckpt = t;
                self.checkpoint();
            }
            let m = &self.shared.metrics;
            m.objects[self.index].store(self.objects.len() as u64, Ordering::Relaxed);
            let clients = &self.objects.clients;
            m.clients[self.index].store(clients.len() as u64, Ordering::Relaxed);
            m.kept_answer_bytes[self.index].store(clients.bytes() as u64, Ordering::Relaxed);
            if let Some(w) = &self.wal {
                m.wal_bytes[self.index].store(w.bytes, Ordering::Relaxed);
            }
            if self.stop {
                break;
            }
        }
        for slot in 0..self.conns.len() {
            if let Some(c) = &self.conns[slot] {
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
            }
            self.close(slot);
        }
    }

    fn checkpoint(&mut self) {
        if let Some(w) = &mut self.wal {
            if w.bytes == 0 {
                return;
            }
            let carry: Vec<u8> = self.open.values().flat_map(|(_, r)| r).copied().collect();
            if let Err(e) = w.checkpoint(&self.objects, now(), &carry) {
                // The log goes on; the next checkpoint tries again.
                tracing::error!("shard {}: checkpoint failed: {e}", self.index);
            } else {
                self.shared
                    .metrics
                    .checkpoints
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn message(&mut self, m: Msg, t: Duration) {
        match m {
            Msg::Conn { id, stream } => self.add_conn(id, stream, t),
            Msg::Forward { from, items } => {
                for (conn, f) in items {
                    self.forwarded(from, conn, f, t);
                }
            }
            Msg::Answers(items) => {
                for (conn, seq, body) in items {
                    self.answer(conn, seq, body, t);
                }
            }
            Msg::Pushes(items) => {
                for (conn, msg) in items {
                    self.push_local(conn, &msg);
                }
            }
            Msg::Applied { from, batches } => {
                for b in batches {
                    if let Some((shards, _)) = self.open.get_mut(&b) {
                        shards.retain(|&s| s != from);
                        if shards.is_empty() {
                            self.open.remove(&b);
                        }
                    }
                }
            }
            Msg::Disconnect(conn) => self.drop_subs(conn),
            Msg::Stop => self.stop = true,
        }
    }

    fn add_conn(&mut self, id: u64, stream: std::net::TcpStream, t: Duration) {
        let mut stream = mio::net::TcpStream::from_std(stream);
        let slot = self.free.pop().unwrap_or(self.conns.len());
        if let Err(e) = self.registry.register(
            &mut stream,
            Token(slot),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!("shard {}: cannot watch connection {id}: {e}", self.index);
            self.free.push(slot);
            self.shared
                .metrics
                .connections
                .fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let token_needed = self.shared.config.token.is_some();
        let tls = match &self.shared.tls {
            Some(config) => match rustls::ServerConnection::new(config.clone()) {
                Ok(mut t) => {
                    // Output is bounded by `max_output` in the connection's own buffer, and
                    // at most one chunk of it is handed to TLS at a time.
                    t.set_buffer_limit(None);
                    Some(Box::new(t))
                }
                Err(e) => {
                    tracing::warn!("shard {}: connection {id}: TLS: {e}", self.index);
                    let _ = self.registry.deregister(&mut stream);
                    self.free.push(slot);
                    self.shared
                        .metrics
                        .connections
                        .fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            },
            None => None,
        };
        let c = Conn::new(id, slot, stream, tls, !token_needed, t);
        if slot == self.conns.len() {
            self.conns.push(None);
        }
        self.conns[slot] = Some(c);
        self.by_id.insert(id, slot);
        // Data may be there already.
        self.again.push(slot);
        if let Some(c) = self.conns[slot].as_mut() {
            c.queued = true;
        }
    }

    /// Reads and serves what connection `slot` sent, as far as its limits allow.
    fn serve(&mut self, slot: usize, t: Duration) {
        let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        c.queued = false;
        let mut budget = READ_BUDGET;
        loop {
            self.frames(&mut c, t);
            if c.closing || c.eof || c.dead || self.held_back(&c) {
                break;
            }
            if budget == 0 {
                // More may be waiting: come back next turn, after the others.
                queue_slot(&mut self.again, &mut c);
                break;
            }
            match c.read_input(&mut self.chunk) {
                Ok(0) => {
                    c.eof = true;
                    if c.start < c.inbuf.len() {
                        tracing::debug!(
                            "connection {} closed inside a frame ({} bytes)",
                            c.id,
                            c.inbuf.len() - c.start
                        );
                    }
                }
                Ok(n) => {
                    c.last_input = t;
                    c.inbuf.extend_from_slice(&self.chunk[..n]);
                    budget = budget.saturating_sub(n);
                    // (Not over TLS: a short read of plaintext says nothing of the socket.)
                    if n < self.chunk.len() && !c.hup && !c.is_tls() {
                        // The socket is drained (a short read): serve what came and skip
                        // the read that would only say `WouldBlock`. Data arriving later
                        // raises a new readiness event (epoll is edge-triggered on arrival);
                        // a hang-up already reported is not reported again, so then the
                        // loop reads on to the end.
                        self.frames(&mut c, t);
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e)
                    if e.get_ref()
                        .is_some_and(|i| i.downcast_ref::<crate::conn::NotTls>().is_some()) =>
                {
                    tracing::debug!("connection {} closed: a plain client of a TLS store", c.id);
                    self.shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
                    c.refuse_plain();
                    c.dead = true;
                }
                Err(e) => {
                    tracing::debug!("connection {} closed: read: {e}", c.id);
                    c.dead = true;
                }
            }
        }
        c.compact();
        mark(&mut self.dirty, &mut c);
        self.conns[slot] = Some(c);
    }

    /// Whether the connection's requests must wait: too many waiting on other shards, or too
    /// much output the client has not read.
    pub(crate) fn held_back(&self, c: &Conn) -> bool {
        let max_inflight = self.shared.config.max_inflight.max(1);
        c.pending.len() >= max_inflight
            || c.waiting_ops >= max_inflight
            || c.out.len() - c.out_pos > self.shared.config.max_output
    }

    /// Runs a request (part) of another shard's connection.
    fn forwarded(&mut self, from: usize, conn: u64, f: Fwd, t: Duration) {
        let (seq, body) = match f {
            Fwd::Batch {
                seq,
                client,
                op_id,
                ack_only,
                ops,
                rest,
                fence,
            } => {
                let mut replies = Vec::with_capacity(ops.len());
                let duplicate = self.run_batch(
                    conn,
                    client,
                    op_id,
                    ack_only,
                    ops.iter().map(|(i, r)| (*i, r.borrowed())),
                    &rest,
                    &mut replies,
                    t,
                );
                if let Some(f) = fence {
                    self.applied[f].push((client, op_id));
                }
                (seq, PartBody::Replies { replies, duplicate })
            }
            Fwd::Partitions { seq, nf, kind, id } => (
                seq,
                PartBody::Keys(self.objects.partitions(&nf, kind, &id, t)),
            ),
            Fwd::Subscribe { seq, key, instance } => {
                self.subscribe(conn, from, key, instance);
                (
                    seq,
                    PartBody::Replies {
                        replies: Vec::new(),
                        duplicate: false,
                    },
                )
            }
            Fwd::Unsubscribe { seq, key } => {
                self.unsubscribe(conn, &key);
                (
                    seq,
                    PartBody::Replies {
                        replies: Vec::new(),
                        duplicate: false,
                    },
                )
            }
        };
        self.answers[from].push((conn, seq, body));
    }

    /// Merges another shard's part of the answer to request `seq` of connection `conn`.
    fn answer(&mut self, conn: u64, seq: u64, body: PartBody, t: Duration) {
        let Some(&slot) = self.by_id.get(&conn) else {
            return;
        };
        let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let was_held = self.held_back(&c);
        if let Some(parked) = c.part(seq, body) {
            self.release(&mut c, *parked, t);
        }
        if was_held && !self.held_back(&c) {
            queue_slot(&mut self.again, &mut c);
        }
        mark(&mut self.dirty, &mut c);
        self.conns[slot] = Some(c);
    }

    /// Runs the parts of a fenced batch whose fence held: this shard's here (its answer merged
    /// as any part's), the others' sent to their shards.
    fn release(&mut self, c: &mut Conn, parked: Parked, t: Duration) {
        let Parked {
            seq,
            client,
            op_id,
            ack_only,
            parts,
            fence,
        } = parked;
        for (s, ops) in parts {
            if s == self.index {
                let mut replies = Vec::with_capacity(ops.len());
                let duplicate = self.run_batch(
                    c.id,
                    client,
                    op_id,
                    ack_only,
                    ops.iter().map(|(i, r)| (*i, r.borrowed())),
                    &[],
                    &mut replies,
                    t,
                );
                if let Some(f) = fence {
                    self.applied[f].push((client, op_id));
                }
                // No fence in this part: it releases nothing more.
                let _ = c.part(seq, PartBody::Replies { replies, duplicate });
            } else {
                self.forwards[s].push((
                    c.id,
                    Fwd::Batch {
                        seq,
                        client,
                        op_id,
                        ack_only,
                        ops,
                        rest: Vec::new(),
                        fence,
                    },
                ));
            }
        }
    }

    pub(crate) fn subscribe(&mut self, conn: u64, shard: usize, key: Vec<u8>, instance: u32) {
        let subs = self.subs.entry(key).or_default();
        subs.list.retain(|s| s.conn != conn);
        subs.list.push(Sub {
            conn,
            instance,
            shard,
        });
    }

    pub(crate) fn unsubscribe(&mut self, conn: u64, key: &[u8]) {
        if let Some(subs) = self.subs.get_mut(key) {
            subs.list.retain(|s| s.conn != conn);
            if subs.list.is_empty() {
                self.subs.remove(key);
            }
        }
    }

    fn drop_subs(&mut self, conn: u64) {
        self.subs.retain(|_, s| {
            s.list.retain(|x| x.conn != conn);
            !s.list.is_empty()
        });
    }

    /// Applies a batch's operations on this shard's objects (or answers a retransmission as
    /// the first time) and records its updates for the log, with `rest`, a fenced batch's parts
    /// on other shards when these are its fence's. Replies go to `replies` with their index in
    /// the frame; returns whether the batch was a duplicate.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_batch<'a>(
        &mut self,
        conn: u64,
        client: u64,
        op_id: u64,
        ack_only: bool,
        ops: impl Iterator<Item = (u32, Request<&'a [u8]>)> + Clone,
        rest: &[Part],
        replies: &mut Vec<(u32, Reply)>,
        t: Duration,
    ) -> bool {
        // An idempotent batch seen before: answer it as the first time, apply nothing.
        let clients = &self.objects.clients;
        if op_id != 0 && clients.last(client).is_some_and(|last| op_id <= last) {
            match clients.answer(client, op_id) {
                Some(r) => replies.extend(r.iter().cloned()),
                None => replies.extend(ops.map(|(i, _)| (i, Reply::Error(Failure::Duplicate)))),
            }
            self.shared
                .metrics
                .duplicates
                .fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let first = replies.len();
        // An ack-only batch's answers are not sent: the values it read are let go at once.
        let budget = match ack_only {
            true => usize::MAX,
            false => self.shared.config.limits.max_frame as usize,
        };
        self.apply_ops(
            conn,
            client,
            op_id,
            ops,
            rest,
            budget,
            |i, r, spare| match ack_only
                && matches!(r, Reply::Value(Some(_)) | Reply::Object(Some(_)))
            {
                true => {
                    shard::reclaim(spare, r);
                    replies.push((i, Reply::Done));
                }
                false => replies.push((i, r)),
            },
            t,
        );
        if op_id != 0 {
            let clients = &mut self.objects.clients;
            clients.applied(client, op_id);
            if !ack_only {
                clients.keep(client, op_id, &replies[first..]);
            }
            let gone = clients.bound();
            let m = &self.shared.metrics;
            m.replies_dropped.fetch_add(gone.answers, Ordering::Relaxed);
            m.clients_forgotten
                .fetch_add(gone.clients, Ordering::Relaxed);
        }
        false
    }

    /// Applies operations in order on this shard's objects, handing each reply (with its
    /// index in the frame, and the shard's spare buffers to return it to) to `reply`, and
    /// records the updates for the log. After a [`Command::Fence`] that does not hold, the
    /// rest is refused without running. If the fence holds, the batch's parts on other shards
    /// (`rest`) go in the record too, and stay open until those shards have logged them (only
    /// with an op id: how recovery tells whether a shard applied its part).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_ops<'a>(
        &mut self,
        conn: u64,
        client: u64,
        op_id: u64,
        ops: impl Iterator<Item = (u32, Request<&'a [u8]>)> + Clone,
        rest: &[Part],
        budget: usize,
        mut reply: impl FnMut(u32, Reply, &mut Spare),
        t: Duration,
    ) {
        let mut writes = false;
        // Where the batch stopped running: at a fence that does not hold, or once its answers
        // passed `budget` bytes (a 20-byte `Get` can answer megabytes).
        let mut fenced_at = None;
        let mut full_at = None;
        let mut answered = 0usize;
        for (i, req) in ops.clone() {
            if fenced_at.is_some() || full_at.is_some() {
                let why = match fenced_at {
                    Some(_) => "the batch's fence does not hold".to_owned(),
                    None => format!(
                        "the batch's answers passed {budget} bytes, the largest frame \
                         (max_frame): send it in smaller batches"
                    ),
                };
                let msg = format!(
                    "{}: not applied: {why}",
                    String::from_utf8_lossy(req.op.key())
                );
                reply(
                    i,
                    Reply::Error(Failure::Refused(msg)),
                    &mut self.objects.spare,
                );
                continue;
            }
            let (r, changed) = self.objects.apply_ref(&req, t);
            if matches!(req.op, Command::Fence { .. }) && r == Reply::Bool(false) {
                fenced_at = Some(i);
            }
            if changed && !self.subs.is_empty() && self.subs.contains_key(req.op.key()) {
                self.touched.push((req.op.key().to_vec(), conn));
            }
            writes |= !req.op.is_read();
            answered = answered.saturating_add(flowstate_proto::reply_len(&r));
            if answered > budget {
                // The operations after this one are not run.
                full_at = Some(i + 1);
                self.shared
                    .metrics
                    .answers_cut
                    .fetch_add(1, Ordering::Relaxed);
            }
            reply(i, r, &mut self.objects.spare);
        }
        let stop = fenced_at.or(full_at);
        let rest = match fenced_at.is_none() && op_id != 0 {
            true => rest,
            false => &[],
        };
        let Some(w) = self.wal.as_mut().filter(|_| writes || !rest.is_empty()) else {
            return;
        };
        w.record(
            t,
            client,
            op_id,
            ops.take_while(|(i, _)| stop.is_none_or(|f| *i < f))
                .map(|(_, r)| r)
                .filter(|r| !r.op.is_read()),
            rest,
        );
        if !rest.is_empty() {
            let mut record = Vec::new();
            crate::wal::encode_record(
                &mut record,
                t,
                client,
                op_id,
                std::iter::empty::<Request>(),
                rest,
            );
            let shards = rest.iter().map(|(s, _)| *s).collect();
            self.open.insert((client, op_id), (shards, record));
        }
    }

    /// Adds the operations counted in this turn to the shared counters.
    pub(crate) fn flush_counts(&mut self) {
        for (i, n) in self.op_counts.iter_mut().enumerate() {
            if *n > 0 {
                self.shared.metrics.ops[i].fetch_add(*n, Ordering::Relaxed);
                *n = 0;
            }
        }
    }

    /// Logs the turn's updates; then queues the notifications they cause.
    fn commit(&mut self, t: Duration) {
        if let Some(w) = &mut self.wal {
            if let Err(e) = w.flush() {
                // Answering now would acknowledge updates that may not survive a restart: a
                // store that cannot write its log stops.
                tracing::error!("shard {}: cannot write the log: {e}; stopping", self.index);
                eprintln!(
                    "flowstate store: shard {}: cannot write the log: {e}",
                    self.index
                );
                std::process::exit(74);
            }
        }
        self.flush_counts();
        self.notify_expired();
        if self.touched.is_empty() {
            return;
        }
        self.touched.sort_unstable();
        self.touched.dedup();
        let touched = std::mem::take(&mut self.touched);
        let mut targets = std::mem::take(&mut self.targets);
        for (key, origin) in &touched {
            targets.clear();
            let Some(subs) = self.subs.get(key) else {
                continue;
            };
            targets.extend(
                subs.list
                    .iter()
                    .filter(|s| s.conn != *origin)
                    .map(|s| (s.shard, s.conn)),
            );
            if targets.is_empty() {
                continue;
            }
            let object = self.objects.current(key, t);
            for &(shard, conn) in &targets {
                let msg = Message::Notify(Notification::Updated {
                    key: key.clone(),
                    object: object.clone(),
                });
                self.push(shard, conn, msg);
            }
        }
        self.targets = targets;
        self.touched = touched;
        self.touched.clear();
    }

    /// Tells exactly one subscriber of each expired key or field (StatelessNF §4.1), round
    /// robin over the shard's expiries.
    fn notify_expired(&mut self) {
        let expired = std::mem::take(&mut self.objects.expired);
        for (key, field) in expired {
            let Some(subs) = self.subs.get(&key) else {
                continue;
            };
            if subs.list.is_empty() {
                continue;
            }
            let i = self.next_expiry % subs.list.len();
            self.next_expiry = self.next_expiry.wrapping_add(1);
            let s = &subs.list[i];
            tracing::debug!(
                "shard {}: expiry of {} told to instance {}",
                self.index,
                String::from_utf8_lossy(&key),
                s.instance
            );
            let (shard, conn) = (s.shard, s.conn);
            self.push(
                shard,
                conn,
                Message::Notify(Notification::Expired { key, field }),
            );
        }
    }

    /// Pushes `msg` to connection `conn` of shard `shard`.
    fn push(&mut self, shard: usize, conn: u64, msg: Message) {
        self.shared
            .metrics
            .notifications
            .fetch_add(1, Ordering::Relaxed);
        if shard == self.index {
            self.push_local(conn, &msg);
        } else if let Some(q) = self.pushes.get_mut(shard) {
            q.push((conn, msg));
        }
    }

    fn push_local(&mut self, conn: u64, msg: &Message) {
        let Some(&slot) = self.by_id.get(&conn) else {
            return;
        };
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if c.dead {
            return;
        }
        c.push(msg);
        if c.out.len() - c.out_pos > self.shared.config.max_output.saturating_mul(8) {
            tracing::debug!(
                "connection {}: closed, {} bytes of pushes not read",
                c.id,
                c.out.len() - c.out_pos
            );
            c.dead = true;
        }
        mark(&mut self.dirty, c);
    }

    /// Hands the turn's forwarded requests, answers and pushes to their shards.
    fn send_out(&mut self) {
        for s in 0..self.forwards.len() {
            if s == self.index
                || (self.forwards[s].is_empty()
                    && self.answers[s].is_empty()
                    && self.pushes[s].is_empty()
                    && self.applied[s].is_empty())
            {
                continue;
            }
            let mut sent = false;
            let shared = self.shared.clone();
            let handle = &shared.shards[s];
            if !self.forwards[s].is_empty() {
                let items = std::mem::take(&mut self.forwards[s]);
                match handle.tx.send(Msg::Forward {
                    from: self.index,
                    items,
                }) {
                    Ok(()) => sent = true,
                    Err(e) => {
                        // That shard has stopped (the store is shutting down): those requests
                        // get no answer, and their connections close unanswered, so that no
                        // client takes an update that was not applied for acknowledged (a
                        // client retransmits unacknowledged batches; op ids keep that exact).
                        if let Msg::Forward { items, .. } = e.0 {
                            for (conn, _) in items {
                                self.kill(conn);
                            }
                        }
                    }
                }
            }
            if !self.answers[s].is_empty() {
                let items = std::mem::take(&mut self.answers[s]);
                sent |= handle.tx.send(Msg::Answers(items)).is_ok();
            }
            if !self.pushes[s].is_empty() {
                let items = std::mem::take(&mut self.pushes[s]);
                sent |= handle.tx.send(Msg::Pushes(items)).is_ok();
            }
            if !self.applied[s].is_empty() {
                let batches = std::mem::take(&mut self.applied[s]);
                let from = self.index;
                sent |= handle.tx.send(Msg::Applied { from, batches }).is_ok();
            }
            if sent {
                let _ = handle.waker.wake();
            }
        }
    }

    /// Writes each marked connection's output (one `write` when the socket takes it all) and
    /// closes the connections that are done.
    fn write_out(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            c.dirty = false;
            let was_held = self.held_back(&c);
            if !c.dead && c.writable && (c.out_pos < c.out.len() || c.tls_pending()) {
                match c.write_output(WRITE_BUDGET) {
                    // More left: written in the next turn, after the others have been served.
                    Ok(()) if c.out_pos < c.out.len() && !c.is_tls() => {
                        queue_slot(&mut self.again, &mut c)
                    }
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => c.writable = false,
                    Err(e) => {
                        tracing::debug!("connection {} closed: write: {e}", c.id);
                        c.dead = true;
                    }
                }
            }
            if c.out_pos == c.out.len() {
                c.out.clear();
                c.out_pos = 0;
                if c.out.capacity() > 4 << 20 {
                    c.out.shrink_to(64 * 1024);
                }
            } else if c.out_pos > 1 << 20 && c.out_pos * 2 > c.out.len() {
                c.out.drain(..c.out_pos);
                c.out_pos = 0;
            }
            let done = c.dead
                || ((c.closing || c.eof)
                    && c.pending.is_empty()
                    && c.out_pos == c.out.len()
                    && !c.tls_pending());
            if !done && was_held && !self.held_back(&c) {
                queue_slot(&mut self.again, &mut c);
            }
            self.conns[slot] = Some(c);
            if done {
                self.close(slot);
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
    }

    /// Closes the connections past [`crate::Config::handshake_timeout`] without their first
    /// frame (telling them why), and those idle past [`crate::Config::idle_timeout`].
    fn reap(&mut self, t: Duration) {
        let config = &self.shared.config;
        let (handshake, idle) = (config.handshake_timeout, config.idle_timeout);
        for slot in 0..self.conns.len() {
            let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            let open = !c.closing && !c.dead;
            if open && !c.greeted_in_time() && t.saturating_sub(c.opened) >= handshake {
                tracing::debug!("connection {}: closed, no first frame in time", c.id);
                self.shared.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                let message = match self.shared.config.token.is_some() {
                    true => format!("no hello with the token within {handshake:?}"),
                    false => format!("no whole frame within {handshake:?}"),
                };
                self.error(&mut c, 0, flowstate_proto::ErrorCode::TimedOut, message);
                c.closing = true;
                mark(&mut self.dirty, &mut c);
            } else if open
                && idle.is_some_and(|idle| t.saturating_sub(c.last_input) >= idle)
                && !c.subscribed
                && c.pending.is_empty()
                && c.out_pos == c.out.len()
                && c.start == c.inbuf.len()
            {
                tracing::debug!("connection {}: closed, idle", c.id);
                self.shared.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                c.closing = true;
                mark(&mut self.dirty, &mut c);
            }
            self.conns[slot] = Some(c);
        }
    }

    /// Closes connection `conn` at the end of the turn, without sending what it waits for.
    fn kill(&mut self, conn: u64) {
        let Some(&slot) = self.by_id.get(&conn) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) {
            c.dead = true;
            mark(&mut self.dirty, c);
        }
    }

    /// Closes the connection in `slot` and drops its subscriptions on every shard.
    fn close(&mut self, slot: usize) {
        let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if !c.dead {
            c.close_tls();
        }
        let _ = self.registry.deregister(&mut c.stream);
        let _ = c.stream.shutdown(std::net::Shutdown::Write);
        self.by_id.remove(&c.id);
        self.free.push(slot);
        self.shared
            .metrics
            .connections
            .fetch_sub(1, Ordering::SeqCst);
        self.drop_subs(c.id);
        for (s, h) in self.shared.shards.iter().enumerate() {
            if s != self.index {
                let _ = h.send(Msg::Disconnect(c.id));
            }
        }
    }
}

/// Marks `c` for the end-of-turn write.
pub(crate) fn mark(dirty: &mut Vec<usize>, c: &mut Conn) {
    if !c.dirty {
        c.dirty = true;
        dirty.push(c.slot);
    }
}

fn queue_slot(again: &mut Vec<usize>, c: &mut Conn) {
    if !c.queued {
        c.queued = true;
        again.push(c.slot);
    }
}
