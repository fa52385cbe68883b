//! The thread of one shard: takes jobs from connections in arrival order, applies them, logs
//! the group, answers, pushes notifications, sweeps expired objects and writes checkpoints.

use crate::conn::{PartBody, ToWriter, WriterTx};
use crate::shard::{Objects, Sub, REPLY_CACHE};
use crate::wal::Wal;
use crate::{now, Metrics};
use flowstate_proto::{Kind, Message, Notification, Reply, Request};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Work for a shard.
pub(crate) enum Job {
    /// This shard's operations of some batches of one connection, in order.
    Batches {
        conn: u64,
        tx: WriterTx,
        items: Vec<BatchItem>,
    },
    Partitions {
        conn: u64,
        tx: WriterTx,
        seq: u64,
        nf: Vec<u8>,
        kind: Kind,
        id: Vec<u8>,
    },
    Subscribe {
        conn: u64,
        tx: WriterTx,
        seq: u64,
        key: Vec<u8>,
        instance: u32,
    },
    Unsubscribe {
        conn: u64,
        tx: WriterTx,
        seq: u64,
        key: Vec<u8>,
    },
    /// A connection closed: drop its subscriptions.
    Disconnect { conn: u64 },
    /// Write a final checkpoint and stop.
    Stop,
}

/// This shard's part of one batch frame.
pub(crate) struct BatchItem {
    /// The frame's sequence number on its connection.
    pub(crate) seq: u64,
    pub(crate) client: u64,
    pub(crate) op_id: u64,
    /// Only an ack is wanted: no answer to keep for a retransmission.
    pub(crate) ack_only: bool,
    /// Operations with their index in the frame.
    pub(crate) ops: Vec<(u32, Request)>,
}

/// How often a shard sweeps expired objects (and so how late an expiry notification may be).
const TICK: Duration = Duration::from_millis(20);
/// Most jobs applied before their group is logged and answered.
const GROUP: usize = 512;

pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) objects: Objects,
    pub(crate) wal: Option<Wal>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) checkpoint_interval: Duration,
    pub(crate) checkpoint_bytes: u64,
    subs: std::collections::HashMap<Vec<u8>, crate::shard::Subs>,
    /// Answers of the current group by connection, sent once the group is logged.
    outbox: Vec<(u64, WriterTx, ToWriter)>,
    /// Keys updated in the current group, with the connection that did it.
    touched: Vec<(Vec<u8>, u64)>,
    /// Round robin over subscribers for expiry notifications, spreading timer work over the
    /// instances (StatelessNF §4.1).
    next_expiry: usize,
}

impl Worker {
    pub(crate) fn new(
        index: usize,
        objects: Objects,
        wal: Option<Wal>,
        metrics: Arc<Metrics>,
        checkpoint_interval: Duration,
        checkpoint_bytes: u64,
    ) -> Worker {
        Worker {
            index,
            objects,
            wal,
            metrics,
            checkpoint_interval,
            checkpoint_bytes,
            subs: Default::default(),
            outbox: Vec::new(),
            touched: Vec::new(),
            next_expiry: 0,
        }
    }

    pub(crate) fn run(mut self, rx: Receiver<Job>) {
        let mut last_sweep = Instant::now();
        let mut last_ckpt = Instant::now();
        loop {
            let first = match rx.recv_timeout(TICK) {
                Ok(j) => Some(j),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let t = now();
            let mut stop = false;
            if let Some(j) = first {
                stop |= self.job(j, t);
                let mut n = 1;
                while n < GROUP && !stop {
                    match rx.try_recv() {
                        Ok(j) => stop |= self.job(j, t),
                        Err(_) => break,
                    }
                    n += 1;
                }
            }
            self.commit();
            if last_sweep.elapsed() >= TICK {
                last_sweep = Instant::now();
                self.objects.sweep(now());
                self.notify_expired();
            }
            let wal_full = self
                .wal
                .as_ref()
                .is_some_and(|w| w.bytes >= self.checkpoint_bytes);
            if stop || wal_full || last_ckpt.elapsed() >= self.checkpoint_interval {
                last_ckpt = Instant::now();
                self.checkpoint();
            }
            self.metrics.objects[self.index].store(self.objects.len() as u64, Ordering::Relaxed);
            if let Some(w) = &self.wal {
                self.metrics.wal_bytes[self.index].store(w.bytes, Ordering::Relaxed);
            }
            if stop {
                break;
            }
        }
    }

    fn checkpoint(&mut self) {
        if let Some(w) = &mut self.wal {
            if w.bytes == 0 {
                return;
            }
            if let Err(e) = w.checkpoint(&self.objects, now()) {
                // The log goes on; the next checkpoint tries again.
                tracing::error!("shard {}: checkpoint failed: {e}", self.index);
            } else {
                self.metrics.checkpoints.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Logs the group, then sends its answers and notifications.
    fn commit(&mut self) {
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
        // One channel operation per run of answers to the same connection.
        let mut run: Option<(u64, WriterTx, Vec<ToWriter>)> = None;
        for (conn, tx, m) in self.outbox.drain(..) {
            match &mut run {
                Some((c, _, v)) if *c == conn => v.push(m),
                _ => {
                    if let Some((_, tx, v)) = run.take() {
                        let _ = tx.send(ToWriter::Many(v));
                    }
                    run = Some((conn, tx, vec![m]));
                }
            }
        }
        if let Some((_, tx, v)) = run {
            let _ = tx.send(ToWriter::Many(v));
        }
        self.notify_expired();
        if self.touched.is_empty() {
            return;
        }
        self.touched.dedup();
        let t = now();
        let touched = std::mem::take(&mut self.touched);
        for (key, origin) in &touched {
            let Some(subs) = self.subs.get(key) else {
                continue;
            };
            if subs.list.iter().all(|s| s.conn == *origin) {
                continue;
            }
            let object = self.objects.current(key, t);
            for s in subs.list.iter().filter(|s| s.conn != *origin) {
                let _ =
                    s.tx.send(ToWriter::Push(Message::Notify(Notification::Updated {
                        key: key.clone(),
                        object: object.clone(),
                    })));
                self.metrics.notifications.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// Tells exactly one subscriber of each expired key or field (StatelessNF §4.1), round
    /// robin over the shard's expiries.
    fn notify_expired(&mut self) {
        for (key, field) in self.objects.expired.drain(..) {
            let Some(subs) = self.subs.get_mut(&key) else {
                continue;
            };
            if subs.list.is_empty() {
                continue;
            }
            let i = self.next_expiry % subs.list.len();
            self.next_expiry = self.next_expiry.wrapping_add(1);
            tracing::debug!(
                "shard {}: expiry of {} told to instance {}",
                self.index,
                String::from_utf8_lossy(&key),
                subs.list[i].instance
            );
            let _ = subs.list[i]
                .tx
                .send(ToWriter::Push(Message::Notify(Notification::Expired {
                    key,
                    field,
                })));
            self.metrics.notifications.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one job; whether it asks the shard to stop.
    fn job(&mut self, job: Job, t: Duration) -> bool {
        match job {
            Job::Batches { conn, tx, items } => {
                for it in items {
                    self.batch(conn, &tx, it, t);
                }
            }
            Job::Partitions {
                conn,
                tx,
                seq,
                nf,
                kind,
                id,
            } => {
                let keys = self.objects.partitions(&nf, kind, &id, t);
                self.outbox.push((
                    conn,
                    tx,
                    ToWriter::Part {
                        seq,
                        body: PartBody::Keys(keys),
                    },
                ));
            }
            Job::Subscribe {
                conn,
                tx,
                seq,
                key,
                instance,
            } => {
                let subs = self.subs.entry(key).or_default();
                subs.list.retain(|s| s.conn != conn);
                subs.list.push(Sub {
                    conn,
                    instance,
                    tx: tx.clone(),
                });
                self.outbox.push((conn, tx, empty_part(seq)));
            }
            Job::Unsubscribe { conn, tx, seq, key } => {
                if let Some(subs) = self.subs.get_mut(&key) {
                    subs.list.retain(|s| s.conn != conn);
                    if subs.list.is_empty() {
                        self.subs.remove(&key);
                    }
                }
                self.outbox.push((conn, tx, empty_part(seq)));
            }
            Job::Disconnect { conn } => {
                self.subs.retain(|_, s| {
                    s.list.retain(|x| x.conn != conn);
                    !s.list.is_empty()
                });
            }
            Job::Stop => return true,
        }
        false
    }

    fn batch(&mut self, conn: u64, tx: &WriterTx, item: BatchItem, t: Duration) {
        let BatchItem {
            seq,
            client,
            op_id,
            ack_only,
            ops,
        } = item;
        // An idempotent batch seen before: answer it as the first time, apply nothing.
        if op_id != 0 {
            if let Some(d) = self.objects.clients.get(&client) {
                if op_id <= d.last {
                    let replies = match d.recent.iter().find(|(id, _)| *id == op_id) {
                        Some((_, r)) => r.clone(),
                        None => ops.iter().map(|(i, _)| (*i, Reply::Duplicate)).collect(),
                    };
                    self.metrics.duplicates.fetch_add(1, Ordering::Relaxed);
                    self.outbox.push((
                        conn,
                        tx.clone(),
                        ToWriter::Part {
                            seq,
                            body: PartBody::Replies {
                                replies,
                                duplicate: true,
                            },
                        },
                    ));
                    return;
                }
            }
        }
        let mut replies = Vec::with_capacity(ops.len());
        let mut writes = false;
        for (i, req) in &ops {
            let (reply, changed) = self.objects.apply(req, t);
            if changed && self.subs.contains_key(req.op.key()) {
                self.touched.push((req.op.key().to_vec(), conn));
            }
            writes |= !req.op.is_read();
            replies.push((*i, reply));
        }
        if writes {
            if let Some(w) = &mut self.wal {
                w.record(
                    t,
                    client,
                    op_id,
                    ops.iter().map(|(_, r)| r).filter(|r| !r.op.is_read()),
                );
            }
        }
        if op_id != 0 {
            let d = self.objects.clients.entry(client).or_default();
            d.last = op_id;
            if !ack_only {
                d.recent.push_back((op_id, replies.clone()));
                if d.recent.len() > REPLY_CACHE {
                    d.recent.pop_front();
                }
            }
        }
        self.outbox.push((
            conn,
            tx.clone(),
            ToWriter::Part {
                seq,
                body: PartBody::Replies {
                    replies,
                    duplicate: false,
                },
            },
        ));
    }
}

fn empty_part(seq: u64) -> ToWriter {
    ToWriter::Part {
        seq,
        body: PartBody::Replies {
            replies: Vec::new(),
            duplicate: false,
        },
    }
}
