//! One client connection, owned by one shard thread's event loop ([`crate::worker`]) from
//! accept to close: no thread of its own, no channel hop for the requests its shard owns.
//!
//! The shard decodes every whole frame the connection sent. A batch whose operations all
//! belong to the connection's own shard (always so with one shard) is applied at once, its
//! keys and values read in place from the connection's input (nothing copied out but what an
//! object keeps), and its answer encoded straight into the connection's output buffer. Otherwise the operations of
//! each other shard are queued for it (and sent, one message per destination shard, at the end
//! of the turn), the request waits in the connection's queue of pending requests, and the
//! other shards' parts are merged into it as they come back; answers always leave in request
//! order, a request answered at once waiting behind earlier ones that are not. The output
//! goes out at the end of the turn, after the turn's log records are written, with one
//! `write`. Pushes (notifications) are sent as they come, outside the request order.
//!
//! Limits: at most [`crate::Config::max_inflight`] requests waiting on other shards, and at
//! most [`crate::Config::max_output`] bytes of unsent output, before the connection's further
//! frames are left unread (in the kernel's buffer, then the client's: TCP backpressure).

use crate::shard::{self, Spare};
use crate::wal::Part;
use crate::worker::{mark, Fwd, Worker};
use flowstate_proto::{
    self as proto, Command, DecodeError, ErrorCode, Failure, Frame, Header, Message, Reply,
    Request, HEADER_LEN,
};
use std::collections::VecDeque;

/// The kind byte of a batch frame.
const BATCH: u8 = 3;
/// The largest frame an unauthenticated connection may send (a hello with its token).
pub(crate) const FIRST_FRAME_MAX: usize = 64 * 1024;
/// The most input buffer reserved ahead of a large frame's bytes.
const RESERVE_AHEAD: usize = 1 << 20;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One shard's part of the answer to a request.
pub(crate) enum PartBody {
    Replies {
        replies: Vec<(u32, Reply)>,
        duplicate: bool,
    },
    Keys(Vec<Vec<u8>>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Replies,
    Ack,
    Keys,
}

/// A request whose answer cannot be sent yet: parts of it are on other shards, or an earlier
/// request is still waiting.
pub(crate) struct Pending {
    id: u64,
    /// Parts still to come.
    parts: u32,
    shape: Shape,
    replies: Vec<Reply>,
    keys: Vec<Vec<u8>>,
    duplicate: bool,
    /// The whole answer, when it is not made of parts.
    ready: Option<Message>,
    /// A fenced batch's parts on other shards than the fence's, held until the fence's part
    /// answers ([`Command::Fence`]): run if it holds, refused if not.
    parked: Option<Box<Parked>>,
    /// Its operations (counted in [`Conn::waiting_ops`] until it is answered).
    ops: usize,
}

/// A fenced batch's parts waiting for its fence ([`Pending::parked`]), then released to be
/// run ([`Conn::part`]).
pub(crate) struct Parked {
    /// The request's sequence number.
    pub(crate) seq: u64,
    /// Its client and op id (for the parts' deduplication) and whether it wants only an ack.
    pub(crate) client: u64,
    pub(crate) op_id: u64,
    pub(crate) ack_only: bool,
    /// The parts, by shard.
    pub(crate) parts: Vec<Part>,
    /// The fence's shard, to be told once each part is logged (with a log and an op id).
    pub(crate) fence: Option<usize>,
}

impl Pending {
    fn into_frame(self) -> Frame {
        let msg = match self.ready {
            Some(m) => m,
            None => match self.shape {
                Shape::Replies => Message::Replies(self.replies),
                Shape::Ack => Message::Ack {
                    duplicate: self.duplicate,
                },
                Shape::Keys => {
                    let mut keys = self.keys;
                    keys.sort_unstable();
                    Message::Keys(keys)
                }
            },
        };
        Frame { id: self.id, msg }
    }
}

/// A connection's state on its shard.
pub(crate) struct Conn {
    pub(crate) id: u64,
    /// Index in the shard's connection table (and mio token).
    pub(crate) slot: usize,
    pub(crate) stream: mio::net::TcpStream,
    /// The TLS session of a TLS store's connection (`None`: plain).
    tls: Option<Box<rustls::ServerConnection>>,
    /// Whether the client's first byte was looked at (a TLS store tells a plain client so).
    tls_started: bool,
    /// No frame served yet (a plain store tells a TLS client so).
    first: bool,
    /// Scope of op ids: the client id a hello gave, else one made from the connection id.
    client: u64,
    authed: bool,
    /// Whether the client said hello (and so has a client id of its own).
    greeted: bool,
    /// Bytes read; `inbuf[start..]` is not served yet.
    pub(crate) inbuf: Vec<u8>,
    pub(crate) start: usize,
    /// Output; `out[out_pos..]` is not sent yet.
    pub(crate) out: Vec<u8>,
    pub(crate) out_pos: usize,
    /// Requests not answered yet, in order; the first has sequence number `front`.
    pub(crate) pending: VecDeque<Pending>,
    /// The operations of those requests' batches: bounded by
    /// [`crate::Config::max_inflight`] as the requests are (a batch of thousands of reads
    /// on other shards weighs what it costs them).
    pub(crate) waiting_ops: usize,
    front: u64,
    /// The socket took everything written so far (no `WouldBlock` since the last writable
    /// event).
    pub(crate) writable: bool,
    /// In the shard's list of connections to serve.
    pub(crate) queued: bool,
    /// In the shard's list of connections to write.
    pub(crate) dirty: bool,
    /// The client closed its side: answer what was read, then close.
    pub(crate) eof: bool,
    /// Read no more: answer what was read, then close (after an error that ends the
    /// connection).
    pub(crate) closing: bool,
    /// Close at once (the socket failed).
    pub(crate) dead: bool,
    /// The client's side hung up or the socket reported an error: read on to the end.
    pub(crate) hup: bool,
    /// When the connection was accepted and when it last sent something (the turn's time):
    /// for [`crate::Config::handshake_timeout`] and [`crate::Config::idle_timeout`].
    pub(crate) opened: Duration,
    pub(crate) last_input: Duration,
    /// It subscribed to a key (waits for pushes, so is never idle).
    pub(crate) subscribed: bool,
}

impl Conn {
    pub(crate) fn new(
        id: u64,
        slot: usize,
        stream: mio::net::TcpStream,
        tls: Option<Box<rustls::ServerConnection>>,
        authed: bool,
        now: Duration,
    ) -> Conn {
        Conn {
            id,
            slot,
            stream,
            tls,
            tls_started: false,
            first: true,
            client: (1 << 63) | id,
            authed,
            greeted: false,
            inbuf: Vec::with_capacity(64 * 1024),
            start: 0,
            out: Vec::with_capacity(64 * 1024),
            out_pos: 0,
            pending: VecDeque::new(),
            waiting_ops: 0,
            front: 0,
            writable: true,
            queued: false,
            dirty: false,
            eof: false,
            closing: false,
            dead: false,
            hup: false,
            opened: now,
            last_input: now,
            subscribed: false,
        }
    }

    /// Whether the connection sent its first whole frame (and, with a token, a hello with
    /// it).
    pub(crate) fn greeted_in_time(&self) -> bool {
        !self.first && self.authed
    }

    /// Whether the connection is TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether TLS records wait to be written to the socket.
    pub(crate) fn tls_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Reads what the client sent: from the socket, or decrypted. `Ok(0)` is the end; a
    /// plain client of a TLS store is an [`ErrorKind::InvalidData`](std::io::ErrorKind) error
    /// carrying [`NotTls`].
    pub(crate) fn read_input(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::{ErrorKind, Read};
        let Some(tls) = self.tls.as_mut() else {
            return self.stream.read(buf);
        };
        loop {
            match tls.reader().read(buf) {
                // Plaintext, or 0 after the client's close_notify.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !self.tls_started {
                // A TLS client starts with a handshake record (content type 22).
                let mut first = [0u8; 1];
                match self.stream.peek(&mut first) {
                    Ok(0) => return Ok(0),
                    Ok(_) if first[0] != 22 => {
                        return Err(std::io::Error::new(ErrorKind::InvalidData, NotTls))
                    }
                    Ok(_) => self.tls_started = true,
                    Err(e) => return Err(e),
                }
            }
            if tls.read_tls(&mut self.stream)? == 0 {
                return Ok(0);
            }
            if let Err(e) = tls.process_new_packets() {
                // Tell the client why (an alert), then give up on the connection.
                let _ = tls.write_tls(&mut self.stream);
                return Err(std::io::Error::new(ErrorKind::InvalidData, e));
            }
            // Handshake answers leave at once (what the socket does not take, at the end of
            // the turn).
            match flush_tls(tls, &mut self.stream) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes output waiting to be sent, at most `budget` bytes (plain) and as far as the socket
    /// takes it: `Err(WouldBlock)` when it is full. A TLS connection encrypts at most 64 KiB ahead of what the socket took, so
    /// that what a client does not read stays in `out` (and counts against `max_output`).
    pub(crate) fn write_output(&mut self, budget: usize) -> std::io::Result<()> {
        use std::io::{ErrorKind, Write};
        let stop = self.out.len().min(self.out_pos.saturating_add(budget));
        let Some(tls) = self.tls.as_mut() else {
            while self.out_pos < stop {
                match self.stream.write(&self.out[self.out_pos..stop]) {
                    Ok(0) => return Err(ErrorKind::WriteZero.into()),
                    Ok(n) => self.out_pos += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(());
        };
        loop {
            flush_tls(tls, &mut self.stream)?;
            if self.out_pos == self.out.len() {
                return Ok(());
            }
            let end = self.out.len().min(self.out_pos + 64 * 1024);
            let n = tls.writer().write(&self.out[self.out_pos..end])?;
            if n == 0 {
                return Err(ErrorKind::WriteZero.into());
            }
            self.out_pos += n;
        }
    }

    /// Ends a TLS session cleanly (a close_notify, if the socket takes it).
    pub(crate) fn close_tls(&mut self) {
        if let Some(tls) = self.tls.as_mut() {
            tls.send_close_notify();
            let _ = flush_tls(tls, &mut self.stream);
        }
    }

    /// Tells a plain client of a TLS store what is wrong, in the plain protocol, after
    /// discarding what it sent (so that the close is a FIN the client reads to the end,
    /// not a reset that could discard the answer).
    pub(crate) fn refuse_plain(&mut self) {
        use std::io::{Read, Write};
        let mut sink = [0u8; 4096];
        for _ in 0..16 {
            match self.stream.read(&mut sink) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let mut frame = Vec::new();
        proto::encode(
            &Frame {
                id: 0,
                msg: Message::Error {
                    code: ErrorCode::Unauthorized,
                    message: "this store serves TLS only: connect with TLS (the store \
                              driver's ca_file)"
                        .into(),
                },
            },
            &mut frame,
        );
        let _ = self.stream.write(&frame);
    }

    /// Drops served input.
    pub(crate) fn compact(&mut self) {
        if self.start == self.inbuf.len() {
            self.inbuf.clear();
            self.start = 0;
            if self.inbuf.capacity() > 4 << 20 {
                self.inbuf.shrink_to(64 * 1024);
            }
        } else if self.start > 0 {
            self.inbuf.drain(..self.start);
            self.start = 0;
        }
    }

    /// The sequence number the next pending request gets.
    fn next_seq(&self) -> u64 {
        self.front + self.pending.len() as u64
    }

    /// Answers request `id` with `msg`, now or in turn.
    fn reply(&mut self, id: u64, msg: Message) {
        if self.pending.is_empty() {
            proto::encode(&Frame { id, msg }, &mut self.out);
        } else {
            self.pending.push_back(Pending {
                id,
                parts: 0,
                shape: Shape::Replies,
                replies: Vec::new(),
                keys: Vec::new(),
                duplicate: false,
                ready: Some(msg),
                parked: None,
                ops: 0,
            });
        }
    }

    /// Sends a push now.
    pub(crate) fn push(&mut self, msg: &Message) {
        encode_ref(msg, &mut self.out);
    }

    /// Merges a part of the answer to request `seq`, then sends every answer now complete at
    /// the front. The part of a fenced batch's fence releases its parked parts: returned to
    /// be run if the fence holds; refused here if not.
    pub(crate) fn part(&mut self, seq: u64, body: PartBody) -> Option<Box<Parked>> {
        let p = seq
            .checked_sub(self.front)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.pending.get_mut(i))?;
        p.parts = p.parts.saturating_sub(1);
        let mut released = None;
        match body {
            PartBody::Replies { replies, duplicate } => {
                p.duplicate |= duplicate;
                if let Some(parked) = p.parked.take() {
                    // The fence's part (the fence is the batch's first operation).
                    let holds = replies
                        .iter()
                        .any(|(i, r)| *i == 0 && *r == Reply::Bool(true));
                    if holds {
                        // Each part answers as any part does.
                        p.parts += parked.parts.len() as u32;
                        released = Some(parked);
                    } else if p.shape == Shape::Replies {
                        refuse_parts(&mut p.replies, &parked.parts);
                    }
                }
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
        self.send_complete();
        released
    }

    /// Sends every answer now complete at the front.
    pub(crate) fn send_complete(&mut self) {
        while self
            .pending
            .front()
            .is_some_and(|p| p.parts == 0 && p.parked.is_none())
        {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            self.front += 1;
            self.waiting_ops -= p.ops;
            proto::encode(&p.into_frame(), &mut self.out);
        }
    }

    fn token_ok(&self, want: Option<&str>, token: &[u8]) -> bool {
        match want {
            None => true,
            // Constant time in the token's content.
            Some(t) => bool::from(subtle::ConstantTimeEq::ct_eq(t.as_bytes(), token)),
        }
    }
}

/// Whether `b` starts like a TLS record carrying a ClientHello.
fn looks_like_client_hello(b: &[u8]) -> bool {
    b.len() >= 6 && b[0] == 0x16 && b[1] == 3 && (1..=4).contains(&b[2]) && b[5] == 1
}

/// The error of a plain client on a TLS store's connection.
#[derive(Debug)]
pub(crate) struct NotTls;

impl std::fmt::Display for NotTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a plain client on a TLS store")
    }
}

impl std::error::Error for NotTls {}

/// Writes the TLS records waiting, until none is left or the socket is full.
fn flush_tls(
    tls: &mut rustls::ServerConnection,
    stream: &mut mio::net::TcpStream,
) -> std::io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Encodes a frame with id 0 holding `msg` (a borrowed message: pushes go to several
/// connections).
fn encode_ref(msg: &Message, out: &mut Vec<u8>) {
    // `proto::encode` wants a `Frame`, which owns its message; pushes are rare next to
    // answers, so a clone is acceptable here.
    proto::encode(
        &Frame {
            id: 0,
            msg: msg.clone(),
        },
        out,
    );
}

/// Appends a `Replies` frame of `replies` (in frame order) to `out`, emptying `replies`: the
/// buffers of their values go to `spare`.
fn encode_replies(out: &mut Vec<u8>, id: u64, replies: &mut Vec<(u32, Reply)>, spare: &mut Spare) {
    let start = proto::begin(out, Message::REPLIES, 0, id);
    proto::put_u32(out, u32::try_from(replies.len()).unwrap_or(u32::MAX));
    for (_, r) in replies.drain(..) {
        proto::put_reply(out, &r);
        shard::reclaim(spare, r);
    }
    proto::finish(out, start);
}

impl Worker {
    /// Serves every whole frame in the connection's input, as far as its limits allow.
    pub(crate) fn frames(&mut self, c: &mut Conn, t: Duration) {
        // The input is lent out while the frames read from it are answered into the
        // connection's output: operations borrow their keys and values from it.
        let inbuf = std::mem::take(&mut c.inbuf);
        let missing = self.frames_in(c, &inbuf, t);
        c.inbuf = inbuf;
        // Make room for the rest of a large frame, up to a bound: memory follows what the
        // client sent, not what it announced.
        if c.authed {
            c.inbuf.reserve(missing.min(RESERVE_AHEAD));
        }
    }

    /// Serves the whole frames of `inbuf[c.start..]`; the bytes still missing of a frame that
    /// is there only in part.
    fn frames_in(&mut self, c: &mut Conn, inbuf: &[u8], t: Duration) -> usize {
        let limits = self.shared.config.limits;
        let mut ops = relend(std::mem::take(&mut self.batch_ops));
        let missing = self.frames_with(c, inbuf, &mut ops, &limits, t);
        self.batch_ops = relend(ops);
        missing
    }

    /// [`Worker::frames_in`] with `ops` to decode batches into.
    fn frames_with<'a>(
        &mut self,
        c: &mut Conn,
        inbuf: &'a [u8],
        ops: &mut Vec<Request<&'a [u8]>>,
        limits: &proto::Limits,
        t: Duration,
    ) -> usize {
        while !c.closing && !c.dead && !self.held_back(c) {
            let avail = &inbuf[c.start..];
            // A TLS ClientHello on a plain store (a handshake record: 0x16, version 0x0301 to
            // 0x0304, a length, then handshake type 1) reads as a Hello frame of at least
            // 66 KB, which would be waited for: answer at once instead (a TLS client fails its
            // handshake on the plain answer, with a clear message). A real first frame of
            // that shape would be a Hello with a token of over 64 KB.
            if c.first && c.tls.is_none() && looks_like_client_hello(avail) {
                self.error(
                    c,
                    0,
                    ErrorCode::Unauthorized,
                    "this store serves plain TCP, not TLS".into(),
                );
                c.closing = true;
                break;
            }
            let h = match proto::peek_header(avail, limits) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    // The length cannot be trusted: answer, then close.
                    tracing::debug!("connection {} closed: {e}", c.id);
                    self.error(c, 0, e.code(), e.to_string());
                    c.closing = true;
                    break;
                }
            };
            if !c.authed && h.total > FIRST_FRAME_MAX {
                // Before the token, only a hello is taken: a large frame is not waited for
                // (nor is room made for it).
                self.error(
                    c,
                    h.id,
                    ErrorCode::TooLarge,
                    format!("a frame before the token is at most {FIRST_FRAME_MAX} bytes"),
                );
                c.closing = true;
                break;
            }
            if avail.len() < h.total {
                return h.total - avail.len();
            }
            let body = &avail[HEADER_LEN..h.total];
            c.start += h.total;
            c.first = false;
            if h.kind == BATCH && c.authed {
                // The common frame: its operations are read in place.
                match proto::decode_batch_into(&h, body, limits, ops) {
                    Ok((op_id, ack_only)) => self.batch(c, h.id, op_id, ack_only, ops, t),
                    Err(e) => {
                        self.error(c, h.id, e.code(), e.to_string());
                        if !e.recoverable() {
                            c.closing = true;
                        }
                    }
                }
                continue;
            }
            let msg = proto::decode_body(&h, body, limits);
            if !self.frame(c, &h, msg, t) {
                c.closing = true;
            }
        }
        0
    }

    pub(crate) fn error(&mut self, c: &mut Conn, id: u64, code: ErrorCode, message: String) {
        self.shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
        c.reply(id, Message::Error { code, message });
    }

    /// Serves one frame; `false` to close the connection after answering.
    fn frame(
        &mut self,
        c: &mut Conn,
        h: &Header,
        msg: Result<Message, DecodeError>,
        t: Duration,
    ) -> bool {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                self.error(c, h.id, e.code(), e.to_string());
                // A sound length lets the stream go on; an unauthenticated client does not.
                return e.recoverable() && c.authed;
            }
        };
        let want = self.shared.config.token.as_ref().map(crate::Secret::expose);
        if !c.authed {
            return match msg {
                Message::Hello { client, token } if c.token_ok(want, &token) => {
                    c.authed = true;
                    c.greeted = true;
                    c.client = client;
                    let shards = self.shared.shards.len() as u32;
                    c.reply(h.id, Message::Welcome { shards });
                    true
                }
                _ => {
                    self.error(
                        c,
                        h.id,
                        ErrorCode::Unauthorized,
                        "this store wants a token: send Hello with it first".into(),
                    );
                    false
                }
            };
        }
        match msg {
            Message::Hello { client, token } => {
                if c.token_ok(want, &token) {
                    c.client = client;
                    c.greeted = true;
                    let shards = self.shared.shards.len() as u32;
                    c.reply(h.id, Message::Welcome { shards });
                } else {
                    self.error(c, h.id, ErrorCode::Unauthorized, "wrong token".into());
                    return false;
                }
            }
            Message::Batch {
                op_id,
                ack_only,
                ops,
            } => {
                let ops: Vec<_> = ops.iter().map(Request::borrowed).collect();
                self.batch(c, h.id, op_id, ack_only, &ops, t);
            }
            Message::Stats => {
                self.flush_counts();
                let v = crate::stats(&self.shared);
                c.reply(h.id, Message::StatsReply(v));
            }
            Message::Partitions { nf, kind, id } => {
                let keys = self.objects.partitions(&nf, kind, &id, t);
                let n = self.shared.shards.len();
                if n == 1 {
                    let mut keys = keys;
                    keys.sort_unstable();
                    c.reply(h.id, Message::Keys(keys));
                } else {
                    let seq = c.next_seq();
                    c.pending.push_back(Pending {
                        id: h.id,
                        parts: n as u32 - 1,
                        shape: Shape::Keys,
                        replies: Vec::new(),
                        keys,
                        duplicate: false,
                        ready: None,
                        parked: None,
                        ops: 0,
                    });
                    for s in (0..n).filter(|s| *s != self.index) {
                        self.forwards[s].push((
                            c.id,
                            Fwd::Partitions {
                                seq,
                                nf: nf.clone(),
                                kind,
                                id: id.clone(),
                            },
                        ));
                    }
                }
            }
            Message::Subscribe { key, instance } => {
                c.subscribed = true;
                let s = self.shared.shard_of(&key);
                if s == self.index {
                    self.subscribe(c.id, s, key, instance);
                    c.reply(h.id, Message::Replies(Vec::new()));
                } else {
                    let seq = self.expect_one(c, h.id);
                    self.forwards[s].push((c.id, Fwd::Subscribe { seq, key, instance }));
                }
            }
            Message::Unsubscribe { key } => {
                let s = self.shared.shard_of(&key);
                if s == self.index {
                    self.unsubscribe(c.id, &key);
                    c.reply(h.id, Message::Replies(Vec::new()));
                } else {
                    let seq = self.expect_one(c, h.id);
                    self.forwards[s].push((c.id, Fwd::Unsubscribe { seq, key }));
                }
            }
            other => {
                self.error(
                    c,
                    h.id,
                    ErrorCode::UnexpectedKind,
                    format!("a server does not take {} frames", kind_name(&other)),
                );
            }
        }
        true
    }

    /// Queues a request answered by one part from another shard; its sequence number.
    fn expect_one(&mut self, c: &mut Conn, id: u64) -> u64 {
        let seq = c.next_seq();
        c.pending.push_back(Pending {
            id,
            parts: 1,
            shape: Shape::Replies,
            replies: Vec::new(),
            keys: Vec::new(),
            duplicate: false,
            ready: None,
            parked: None,
            ops: 0,
        });
        seq
    }

    /// Serves a batch: at once when this shard owns all its operations, else split over the
    /// shards that own them.
    fn batch(
        &mut self,
        c: &mut Conn,
        id: u64,
        op_id: u64,
        ack_only: bool,
        ops: &[Request<&[u8]>],
        t: Duration,
    ) {
        let me = self.index;
        let mut local = true;
        for r in ops {
            self.op_counts[usize::from(r.op.code())] += 1;
            local &= self.shared.shard_of(r.op.key()) == me;
        }
        // Op ids are scoped by the client id a hello gives; without one they are ignored (a
        // server-made id does not survive a reconnect).
        let op_id = if c.greeted { op_id } else { 0 };
        if local {
            self.local_batch(c, id, op_id, ack_only, ops, t);
        } else {
            self.split_batch(c, id, op_id, ack_only, ops, t);
        }
        mark(&mut self.dirty, c);
    }

    /// Serves a batch whose operations this shard owns: applied now, answered now or, behind
    /// earlier requests still waiting, in turn.
    fn local_batch(
        &mut self,
        c: &mut Conn,
        id: u64,
        op_id: u64,
        ack_only: bool,
        ops: &[Request<&[u8]>],
        t: Duration,
    ) {
        let count = ops.len();
        if op_id == 0 && !ack_only && c.pending.is_empty() {
            // The common request: each reply is written as its operation runs.
            let out = &mut c.out;
            let start = proto::begin(out, Message::REPLIES, 0, id);
            proto::put_u32(out, u32::try_from(count).unwrap_or(u32::MAX));
            let numbered = ops.iter().enumerate().map(|(i, r)| (i as u32, *r));
            self.apply_ops(
                c.id,
                c.client,
                0,
                numbered,
                &[],
                self.shared.config.limits.max_frame as usize,
                |_, r, spare| {
                    proto::put_reply(out, &r);
                    shard::reclaim(spare, r);
                },
                t,
            );
            proto::finish(out, start);
            return;
        }
        let mut replies = std::mem::take(&mut self.replies);
        replies.clear();
        let duplicate = self.run_batch(
            c.id,
            c.client,
            op_id,
            ack_only,
            ops.iter().enumerate().map(|(i, r)| (i as u32, *r)),
            &[],
            &mut replies,
            t,
        );
        let in_order = !duplicate
            || (replies.len() == count
                && replies
                    .iter()
                    .enumerate()
                    .all(|(i, (j, _))| i == *j as usize));
        if c.pending.is_empty() && (ack_only || in_order) {
            if ack_only {
                proto::encode(
                    &Frame {
                        id,
                        msg: Message::Ack { duplicate },
                    },
                    &mut c.out,
                );
            } else {
                encode_replies(&mut c.out, id, &mut replies, &mut self.objects.spare);
            }
        } else {
            let mut slots = Vec::new();
            if !ack_only {
                slots = vec![Reply::Done; count];
                for (i, r) in replies.drain(..) {
                    if let Some(s) = slots.get_mut(i as usize) {
                        *s = r;
                    }
                }
            }
            let p = Pending {
                id,
                parts: 0,
                shape: if ack_only { Shape::Ack } else { Shape::Replies },
                replies: slots,
                keys: Vec::new(),
                duplicate,
                ready: None,
                parked: None,
                ops: count,
            };
            if c.pending.is_empty() {
                proto::encode(&p.into_frame(), &mut c.out);
            } else {
                c.waiting_ops += count;
                c.pending.push_back(p);
            }
        }
        replies.clear();
        self.replies = replies;
    }

    /// Runs this shard's part of a batch now (with `rest` as in [`Worker::run_batch`]), its
    /// replies put in their `slots`; whether the batch was a duplicate, and whether its first
    /// operation answered yes (a fence held).
    #[allow(clippy::too_many_arguments)]
    fn run_here(
        &mut self,
        conn: u64,
        client: u64,
        op_id: u64,
        ack_only: bool,
        part: &[(u32, Request)],
        rest: &[Part],
        slots: &mut [Reply],
        t: Duration,
    ) -> (bool, bool) {
        let mut replies = std::mem::take(&mut self.replies);
        replies.clear();
        let duplicate = self.run_batch(
            conn,
            client,
            op_id,
            ack_only,
            part.iter().map(|(i, r)| (*i, r.borrowed())),
            rest,
            &mut replies,
            t,
        );
        let holds = replies
            .iter()
            .any(|(i, r)| *i == 0 && *r == Reply::Bool(true));
        for (i, r) in replies.drain(..) {
            if let Some(slot) = slots.get_mut(i as usize) {
                *slot = r;
            }
        }
        self.replies = replies;
        (duplicate, holds)
    }

    /// Serves a batch over the shards that own its operations: this shard's part now, the
    /// others' sent to them (owned copies); the answer waits for every part.
    fn split_batch(
        &mut self,
        c: &mut Conn,
        id: u64,
        op_id: u64,
        ack_only: bool,
        ops: &[Request<&[u8]>],
        t: Duration,
    ) {
        let me = self.index;
        let client = c.client;
        let count = ops.len();
        let mut parts = std::mem::take(&mut self.parts);
        for (i, r) in ops.iter().enumerate() {
            let s = self.shared.shard_of(r.op.key());
            parts[s].push((i as u32, r.owned()));
        }
        let seq = c.next_seq();
        let mut slots = if ack_only {
            Vec::new()
        } else {
            vec![Reply::Done; count]
        };
        let mut duplicate = false;
        let mut remote = 0u32;
        // A fenced batch: the fence's part first, logged with the others (which makes the
        // batch whole across a crash, see `wal`), the others once it holds.
        let fence = ops
            .first()
            .filter(|r| matches!(r.op, Command::Fence { .. }))
            .map(|r| self.shared.shard_of(r.op.key()));
        let mut parked = None;
        // The fence's shard to tell once a part is logged.
        let mut tell = None;
        let mut rest = Vec::new();
        if let Some(f) = fence {
            let waiting: Vec<Part> = parts
                .iter_mut()
                .enumerate()
                .filter(|(s, part)| *s != f && !part.is_empty())
                .map(|(s, part)| (s, std::mem::take(part)))
                .collect();
            let logged = self.wal.is_some() && op_id != 0 && !waiting.is_empty();
            if f == me {
                // Run the fence's part here and now; the rest goes on only if it holds.
                let (dup, holds) = self.run_here(
                    c.id, client, op_id, ack_only, &parts[f], &waiting, &mut slots, t,
                );
                duplicate |= dup;
                parts[f].clear();
                if holds {
                    tell = logged.then_some(me);
                    for (s, part) in waiting {
                        parts[s] = part;
                    }
                } else {
                    refuse_parts(&mut slots, &waiting);
                }
            } else if !waiting.is_empty() {
                if logged {
                    rest.clone_from(&waiting);
                }
                parked = Some(Box::new(Parked {
                    seq,
                    client,
                    op_id,
                    ack_only,
                    parts: waiting,
                    fence: logged.then_some(f),
                }));
            }
        }
        for (s, part) in parts.iter_mut().enumerate() {
            if part.is_empty() {
                continue;
            }
            if s == me {
                duplicate |= self
                    .run_here(c.id, client, op_id, ack_only, part, &[], &mut slots, t)
                    .0;
                part.clear();
            } else {
                remote += 1;
                let ops = std::mem::take(part);
                // The fence's part carries the rest (when the fence is elsewhere), each other
                // part the fence's shard to tell (when the fence ran here).
                let is_fence = fence == Some(s);
                self.forwards[s].push((
                    c.id,
                    Fwd::Batch {
                        seq,
                        client,
                        op_id,
                        ack_only,
                        ops,
                        rest: if is_fence {
                            std::mem::take(&mut rest)
                        } else {
                            Vec::new()
                        },
                        fence: if is_fence { None } else { tell },
                    },
                ));
            }
        }
        self.parts = parts;
        c.pending.push_back(Pending {
            id,
            parts: remote,
            shape: if ack_only { Shape::Ack } else { Shape::Replies },
            replies: slots,
            keys: Vec::new(),
            duplicate,
            ready: None,
            parked,
            ops: count,
        });
        c.waiting_ops += count;
        // A fence refused here leaves nothing to wait for.
        c.send_complete();
    }
}

/// An empty vector with the allocation of `v`, for borrows of another lifetime: the reused
/// list of a batch's operations, which borrow from one connection's input at a time.
/// (Collecting a vector's own emptied iterator reuses its allocation.)
#[allow(clippy::unnecessary_filter_map)] // `filter` cannot change the type (its lifetime)
fn relend<'b>(mut v: Vec<Request<&[u8]>>) -> Vec<Request<&'b [u8]>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
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

/// The replies of a fenced batch's parts that its fence refused: each operation not applied.
fn refuse_parts(replies: &mut [Reply], parts: &[Part]) {
    for (i, r) in parts.iter().flat_map(|(_, ops)| ops) {
        if let Some(slot) = replies.get_mut(*i as usize) {
            *slot = Reply::Error(Failure::Refused(format!(
                "{}: not applied: the batch's fence does not hold",
                String::from_utf8_lossy(r.op.key())
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_proto::Op;

    #[test]
    fn the_operation_list_keeps_its_allocation_across_inputs() {
        let input = b"key".to_vec();
        let mut v: Vec<Request<&[u8]>> = Vec::with_capacity(64);
        v.push(Op::Get { key: &input[..] }.into());
        let at = v.as_ptr() as usize;
        let v = relend(v);
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 64);
        assert_eq!(v.as_ptr() as usize, at);
    }
}
