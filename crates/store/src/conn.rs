//! One client connection: a reader thread that decodes frames and hands each batch's
//! operations to the shards that own their objects, and a writer thread that puts the answers
//! back together and sends them in request order (pipelining: the reader never waits for an
//! answer, only for the in-flight limit).

use crate::worker::{BatchItem, Job};
use crate::Shared;
use flowstate_proto::{
    self as proto, DecodeError, ErrorCode, Frame, Header, Message, Reply, Request, HEADER_LEN,
};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// What the writer of a connection receives.
pub(crate) enum ToWriter {
    /// The request with sequence number `seq` will be answered by `parts` parts.
    Expect {
        seq: u64,
        id: u64,
        parts: u32,
        ops: u32,
        shape: Shape,
    },
    /// One shard's part of the answer to request `seq`.
    Part { seq: u64, body: PartBody },
    /// The whole answer to request `seq`.
    Ready { seq: u64, frame: Frame },
    /// A frame to send now (notifications).
    Push(Message),
    /// Several of the above, in order (one channel operation for everything a reader or a
    /// shard produced in one go).
    Many(Vec<ToWriter>),
    /// No more requests: send what is pending, then close.
    Close,
}

/// The sending half of a writer's channel.
pub(crate) type WriterTx = Sender<ToWriter>;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Replies,
    Ack,
    Keys,
}

pub(crate) enum PartBody {
    Replies {
        replies: Vec<(u32, Reply)>,
        duplicate: bool,
    },
    Keys(Vec<Vec<u8>>),
}

/// Requests read but not yet answered, shared by the reader (which waits when there are too
/// many) and the writer.
#[derive(Default)]
pub(crate) struct InFlight {
    n: Mutex<usize>,
    cv: Condvar,
}

impl InFlight {
    /// Counts one more request if that stays within `max`.
    fn try_add(&self, max: usize) -> bool {
        let mut n = self.n.lock().unwrap_or_else(PoisonError::into_inner);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn add(&self, max: usize) {
        let mut n = self.n.lock().unwrap_or_else(PoisonError::into_inner);
        while *n >= max {
            n = self.cv.wait(n).unwrap_or_else(PoisonError::into_inner);
        }
        *n += 1;
    }
    fn done(&self, k: usize) {
        let mut n = self.n.lock().unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(k);
        self.cv.notify_all();
    }
}

/// Serves one accepted connection until it closes; runs on its own thread and starts the
/// writer thread.
pub(crate) fn serve(stream: TcpStream, conn: u64, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (tx, rx) = std::sync::mpsc::channel();
    let inflight = Arc::new(InFlight::default());
    let writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("connection {conn}: {e}");
            return;
        }
    };
    let wf = inflight.clone();
    let writer = std::thread::Builder::new()
        .name(format!("store-conn{conn}-w"))
        .spawn(move || write_loop(writer, rx, wf));
    let writer = match writer {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("connection {conn}: cannot start its writer: {e}");
            return;
        }
    };
    let mut reader = Reader {
        stream,
        conn,
        shared: shared.clone(),
        tx,
        inflight,
        seq: 0,
        client: (1 << 63) | conn,
        authed: shared.config.token.is_none(),
        greeted: false,
        buf: Vec::with_capacity(64 * 1024),
        parts: Vec::new(),
        to_writer: Vec::new(),
        to_shards: Vec::new(),
    };
    if let Err(why) = reader.run() {
        tracing::debug!("connection {conn} closed: {why}");
    }
    reader.flush_pending();
    let _ = reader.tx.send(ToWriter::Close);
    for s in &shared.shards {
        let _ = s.send(Job::Disconnect { conn });
    }
    let _ = writer.join();
    let _ = reader.stream.shutdown(Shutdown::Both);
}

struct Reader {
    stream: TcpStream,
    conn: u64,
    shared: Arc<Shared>,
    tx: WriterTx,
    inflight: Arc<InFlight>,
    seq: u64,
    client: u64,
    authed: bool,
    /// Whether the client said hello (and so has a client id of its own).
    greeted: bool,
    buf: Vec<u8>,
    /// Per-shard operation lists, reused.
    parts: Vec<Vec<(u32, Request)>>,
    /// What goes to the writer and to the shards once the frames read so far are decoded:
    /// one channel operation each per read, not per frame.
    to_writer: Vec<ToWriter>,
    to_shards: Vec<Vec<BatchItem>>,
}

impl Reader {
    fn run(&mut self) -> Result<(), String> {
        let limits = self.shared.config.limits;
        let mut start = 0;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            // Serve every whole frame in the buffer.
            loop {
                let avail = &self.buf[start..];
                let h = match proto::peek_header(avail, &limits) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        // The length cannot be trusted: answer, then close.
                        self.error(0, e.code(), e.to_string());
                        self.flush_pending();
                        return Err(e.to_string());
                    }
                };
                if avail.len() < h.total {
                    break;
                }
                let msg =
                    proto::decode_body(&h, &self.buf[start + HEADER_LEN..start + h.total], &limits);
                start += h.total;
                if !self.frame(&h, msg)? {
                    self.flush_pending();
                    return Ok(());
                }
            }
            self.flush_pending();
            self.buf.drain(..start);
            start = 0;
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(())
                } else {
                    Err(format!("closed inside a frame ({} bytes)", self.buf.len()))
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends what the frames decoded so far produced.
    fn flush_pending(&mut self) {
        if !self.to_writer.is_empty() {
            let v = std::mem::take(&mut self.to_writer);
            let _ = self.tx.send(ToWriter::Many(v));
        }
        for (s, items) in self.to_shards.iter_mut().enumerate() {
            if items.is_empty() {
                continue;
            }
            let items = std::mem::take(items);
            let job = Job::Batches {
                conn: self.conn,
                tx: self.tx.clone(),
                items,
            };
            send_job(&self.shared.shards[s], job);
        }
    }

    fn next_seq(&mut self) -> u64 {
        let max = self.shared.config.max_inflight.max(1);
        if !self.inflight.try_add(max) {
            // The writer must see what is pending before it can free a place.
            self.flush_pending();
            self.inflight.add(max);
        }
        let s = self.seq;
        self.seq += 1;
        s
    }

    fn ready(&mut self, id: u64, msg: Message) {
        let seq = self.next_seq();
        self.to_writer.push(ToWriter::Ready {
            seq,
            frame: Frame { id, msg },
        });
    }

    fn error(&mut self, id: u64, code: ErrorCode, message: String) {
        self.shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
        self.ready(id, Message::Error { code, message });
    }

    /// Serves one frame; `Ok(false)` to close the connection after answering.
    fn frame(&mut self, h: &Header, msg: Result<Message, DecodeError>) -> Result<bool, String> {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                self.error(h.id, e.code(), e.to_string());
                // A sound length lets the stream go on; an unauthenticated client does not.
                return Ok(e.recoverable() && self.authed);
            }
        };
        if !self.authed {
            return Ok(self.hello(h.id, msg));
        }
        match msg {
            Message::Hello { client, token } => {
                if self.token_ok(&token) {
                    self.client = client;
                    self.greeted = true;
                    let shards = self.shared.shards.len() as u32;
                    self.ready(h.id, Message::Welcome { shards });
                } else {
                    self.error(h.id, ErrorCode::Unauthorized, "wrong token".into());
                    return Ok(false);
                }
            }
            Message::Batch {
                op_id,
                ack_only,
                ops,
            } => self.batch(h.id, op_id, ack_only, ops),
            Message::Stats => {
                let v = crate::stats(&self.shared);
                self.ready(h.id, Message::StatsReply(v));
            }
            Message::Partitions { nf, kind, id } => {
                let seq = self.next_seq();
                let n = self.shared.shards.len() as u32;
                self.to_writer.push(ToWriter::Expect {
                    seq,
                    id: h.id,
                    parts: n,
                    ops: 0,
                    shape: Shape::Keys,
                });
                self.flush_pending();
                for s in &self.shared.shards {
                    let job = Job::Partitions {
                        conn: self.conn,
                        tx: self.tx.clone(),
                        seq,
                        nf: nf.clone(),
                        kind,
                        id: id.clone(),
                    };
                    send_job(s, job);
                }
            }
            Message::Subscribe { key, instance } => {
                let seq = self.expect_one(h.id);
                let s = self.shared.shard_of(&key);
                let job = Job::Subscribe {
                    conn: self.conn,
                    tx: self.tx.clone(),
                    seq,
                    key,
                    instance,
                };
                send_job(&self.shared.shards[s], job);
            }
            Message::Unsubscribe { key } => {
                let seq = self.expect_one(h.id);
                let s = self.shared.shard_of(&key);
                let job = Job::Unsubscribe {
                    conn: self.conn,
                    tx: self.tx.clone(),
                    seq,
                    key,
                };
                send_job(&self.shared.shards[s], job);
            }
            other => {
                self.error(
                    h.id,
                    ErrorCode::UnexpectedKind,
                    format!("a server does not take {} frames", kind_name(&other)),
                );
            }
        }
        Ok(true)
    }

    fn expect_one(&mut self, id: u64) -> u64 {
        let seq = self.next_seq();
        self.to_writer.push(ToWriter::Expect {
            seq,
            id,
            parts: 1,
            ops: 0,
            shape: Shape::Replies,
        });
        self.flush_pending();
        seq
    }

    fn token_ok(&self, token: &[u8]) -> bool {
        match &self.shared.config.token {
            None => true,
            Some(t) => {
                let t = t.as_bytes();
                // Constant time in the token's content.
                t.len() == token.len()
                    && t.iter().zip(token).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
            }
        }
    }

    fn hello(&mut self, id: u64, msg: Message) -> bool {
        match msg {
            Message::Hello { client, token } if self.token_ok(&token) => {
                self.authed = true;
                self.greeted = true;
                self.client = client;
                let shards = self.shared.shards.len() as u32;
                self.ready(id, Message::Welcome { shards });
                true
            }
            _ => {
                self.error(
                    id,
                    ErrorCode::Unauthorized,
                    "this store wants a token: send Hello with it first".into(),
                );
                false
            }
        }
    }

    fn batch(&mut self, id: u64, op_id: u64, ack_only: bool, ops: Vec<Request>) {
        let n = self.shared.shards.len();
        self.parts.resize_with(n, Vec::new);
        let count = ops.len() as u32;
        for (i, r) in ops.into_iter().enumerate() {
            self.shared.metrics.ops[usize::from(r.op.code())].fetch_add(1, Ordering::Relaxed);
            let s = self.shared.shard_of(r.op.key());
            self.parts[s].push((i as u32, r));
        }
        let used = self.parts.iter().filter(|p| !p.is_empty()).count() as u32;
        let seq = self.next_seq();
        self.to_writer.push(ToWriter::Expect {
            seq,
            id,
            parts: used,
            ops: count,
            shape: if ack_only { Shape::Ack } else { Shape::Replies },
        });
        self.to_shards.resize_with(n, Vec::new);
        for (s, part) in self.parts.iter_mut().enumerate() {
            if part.is_empty() {
                continue;
            }
            let ops = std::mem::take(part);
            self.to_shards[s].push(BatchItem {
                seq,
                client: self.client,
                // Op ids are scoped by the client id a hello gives; without one they are
                // ignored (a server-made id does not survive a reconnect).
                op_id: if self.greeted { op_id } else { 0 },
                ack_only,
                ops,
            });
        }
    }
}

/// Hands `job` to a shard. A shard that has stopped (the server is shutting down) cannot
/// answer: its part of each request is answered here, refused, so the writer never waits
/// for it.
fn send_job(shard: &std::sync::mpsc::Sender<Job>, job: Job) {
    let Err(std::sync::mpsc::SendError(job)) = shard.send(job) else {
        return;
    };
    let refused = |ops: &[(u32, Request)]| PartBody::Replies {
        replies: ops
            .iter()
            .map(|(i, _)| (*i, Reply::Refused("the store is shutting down".into())))
            .collect(),
        duplicate: false,
    };
    match job {
        Job::Batches { tx, items, .. } => {
            let parts = items
                .iter()
                .map(|it| ToWriter::Part {
                    seq: it.seq,
                    body: refused(&it.ops),
                })
                .collect();
            let _ = tx.send(ToWriter::Many(parts));
        }
        Job::Partitions { tx, seq, .. } => {
            let _ = tx.send(ToWriter::Part {
                seq,
                body: PartBody::Keys(Vec::new()),
            });
        }
        Job::Subscribe { tx, seq, .. } | Job::Unsubscribe { tx, seq, .. } => {
            let _ = tx.send(ToWriter::Part {
                seq,
                body: refused(&[]),
            });
        }
        Job::Disconnect { .. } | Job::Stop => {}
    }
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::Hello { .. } => "Hello",
        Message::Welcome { .. } => "Welcome",
        Message::Batch { .. } => "Batch",
        Message::Replies(_) => "Replies",
        Message::Ack { .. } => "Ack",
        Message::Error { .. } => "Error",
        Message::Stats => "Stats",
        Message::StatsReply(_) => "StatsReply",
        Message::Partitions { .. } => "Partitions",
        Message::Keys(_) => "Keys",
        Message::Subscribe { .. } => "Subscribe",
        Message::Unsubscribe { .. } => "Unsubscribe",
        Message::Notify(_) => "Notify",
    }
}

struct Pending {
    id: u64,
    parts: u32,
    shape: Shape,
    replies: Vec<Reply>,
    keys: Vec<Vec<u8>>,
    duplicate: bool,
    ready: Option<Frame>,
}

impl Pending {
    fn complete(&self) -> bool {
        self.ready.is_some() || self.parts == 0
    }
}

fn write_loop(mut stream: TcpStream, rx: Receiver<ToWriter>, inflight: Arc<InFlight>) {
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut front = 0u64; // seq of pending[0]
    let mut out = Vec::with_capacity(64 * 1024);
    let mut closing = false;
    while let Ok(first) = rx.recv() {
        let mut stack = vec![first];
        while let Some(m) = stack.pop() {
            match m {
                ToWriter::Many(v) => stack.extend(v.into_iter().rev()),
                ToWriter::Expect {
                    seq,
                    id,
                    parts,
                    ops,
                    shape,
                } => {
                    debug_assert_eq!(seq, front + pending.len() as u64);
                    pending.push_back(Pending {
                        id,
                        parts,
                        shape,
                        replies: if shape == Shape::Replies {
                            vec![Reply::Done; ops as usize]
                        } else {
                            Vec::new()
                        },
                        keys: Vec::new(),
                        duplicate: false,
                        ready: None,
                    });
                }
                ToWriter::Ready { seq, frame } => {
                    debug_assert_eq!(seq, front + pending.len() as u64);
                    pending.push_back(Pending {
                        id: frame.id,
                        parts: 0,
                        shape: Shape::Replies,
                        replies: Vec::new(),
                        keys: Vec::new(),
                        duplicate: false,
                        ready: Some(frame),
                    });
                }
                ToWriter::Part { seq, body } => {
                    let Some(p) = seq
                        .checked_sub(front)
                        .and_then(|i| pending.get_mut(i as usize))
                    else {
                        continue;
                    };
                    p.parts = p.parts.saturating_sub(1);
                    match body {
                        PartBody::Replies { replies, duplicate } => {
                            p.duplicate |= duplicate;
                            if p.shape == Shape::Replies {
                                for (i, r) in replies {
                                    if let Some(slot) = p.replies.get_mut(i as usize) {
                                        *slot = r;
                                    }
                                }
                            }
                        }
                        PartBody::Keys(k) => p.keys.extend(k),
                    }
                }
                ToWriter::Push(msg) => proto::encode(&Frame { id: 0, msg }, &mut out),
                ToWriter::Close => closing = true,
            }
            if stack.is_empty() {
                if let Ok(m) = rx.try_recv() {
                    stack.push(m);
                }
            }
        }
        let mut answered = 0;
        while pending.front().is_some_and(Pending::complete) {
            let Some(mut p) = pending.pop_front() else {
                break;
            };
            front += 1;
            answered += 1;
            let frame = match p.ready.take() {
                Some(f) => f,
                None => Frame {
                    id: p.id,
                    msg: match p.shape {
                        Shape::Replies => Message::Replies(p.replies),
                        Shape::Ack => Message::Ack {
                            duplicate: p.duplicate,
                        },
                        Shape::Keys => {
                            p.keys.sort_unstable();
                            Message::Keys(p.keys)
                        }
                    },
                },
            };
            proto::encode(&frame, &mut out);
        }
        if !out.is_empty() {
            if stream.write_all(&out).is_err() {
                let _ = stream.shutdown(Shutdown::Both);
                inflight.done(usize::MAX);
                break;
            }
            out.clear();
            if out.capacity() > 4 << 20 {
                out.shrink_to(64 * 1024);
            }
        }
        inflight.done(answered);
        if closing && pending.is_empty() {
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Write);
}
