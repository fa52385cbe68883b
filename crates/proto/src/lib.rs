//! The binary protocol of flowstate's state store (`flowstate store`), shared by the server
//! (`flowstate-store`) and its client (`flowstate-driver-store`).
//!
//! A connection carries **frames** both ways over TCP. Every frame is length-prefixed and
//! versioned; every request carries a request id that its answer repeats, so a client may send
//! many requests before reading any answer (pipelining). One [`Message::Batch`] frame carries
//! many operations (StatelessNF §5.3: batching cuts the per-operation cost of the store by an
//! order of magnitude). Integers are little-endian.
//!
//! ```text
//!  0         4         5         6         8                        16
//! +---------+---------+---------+---------+------------------------+------------------+
//! | length  | version |  kind   |  flags  |       request id       |  body ...        |
//! |  u32    |   u8    |   u8    |   u16   |          u64           |  length-12 bytes |
//! +---------+---------+---------+---------+------------------------+------------------+
//!   length = bytes after the length field (12 + body), at most Limits::max_frame
//!
//! Batch body:   op id u64 | op count u32 | op * count
//! op:           opcode u8 | meta u8 | [instance u32 if meta&1] | [clock u64 if meta&2]
//!               | key (bytes) | arguments of the opcode
//! bytes:        length u32 | that many bytes
//! Replies body: reply count u32 | reply * count        (tag u8 | payload)
//! Error body:   code u16 | message (bytes, UTF-8)
//! ```
//!
//! Promises:
//! * [`decode`] never panics and never allocates more than the frame it was given could hold:
//!   every length and count is checked against the bytes that are really there and against
//!   [`Limits`] before anything is reserved. Anything wrong is a [`DecodeError`] that maps to an
//!   [`ErrorCode`] the server sends back.
//! * [`encode`] of any [`Frame`] followed by [`decode`] gives the same frame back (property
//!   tested).
//! * A frame whose header is readable but whose version or body is wrong can be skipped (its
//!   length is known), so a server answers it with an error frame and keeps the connection;
//!   only an oversize or unreadable length forces a close.
//! * Operations, replies and objects are the state API's, defined once in `flowstate-objects`
//!   ([`Op`], whose discriminants are the opcodes; [`Reply`]; [`Object`]): the driver passes
//!   the state API's operations and replies through unchanged. This crate knows nothing of
//!   `flowstate-state`; it adds the ownership operations ([`Command`]) and the protocol's
//!   failures ([`Failure`]), and [`put_request`] writes an operation with keys of any byte type
//!   as it is ([`Encode`]).
//!
//! Beyond the state API's operations the protocol carries what CHC's store offers (CHC §4.3,
//! §5.1, §5.3): non-blocking batches answered by a bare [`Message::Ack`], idempotent op ids
//! (a retransmitted batch is not applied twice), logical-clock tags with duplicate suppression,
//! ownership of per-flow objects with a handover operation, subscriptions whose updates are
//! pushed ([`Message::Notify`]), and expiry notifications sent to exactly one subscriber
//! (StatelessNF §4.1).

use flowstate_objects::Action;
use std::time::Duration;

/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Bytes of the frame header, the length field included.
pub const HEADER_LEN: usize = 16;
/// Default port of the store.
pub const DEFAULT_PORT: u16 = 7878;

/// Batch flag: the client wants only an [`Message::Ack`], not the replies (non-blocking
/// updates, CHC §4.3).
pub const FLAG_ACK_ONLY: u16 = 1;

const META_INSTANCE: u8 = 1;
const META_CLOCK: u8 = 2;

/// Limits every decoder enforces; servers make them configurable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes in a frame after its length field.
    pub max_frame: u32,
    /// Most operations in one batch.
    pub max_ops: u32,
}

impl Default for Limits {
    /// 64 MiB frames, 65 536 operations per batch.
    fn default() -> Self {
        Limits {
            max_frame: 64 << 20,
            max_ops: 65_536,
        }
    }
}

/// The type of an object (the state API's kinds); its discriminant is its wire code.
pub use flowstate_objects::Kind;

/// One operation of the state API on the object under a key, with its semantics exactly:
/// [`flowstate_objects::Op`], whose discriminant is the operation's opcode.
///
/// `B` holds the byte strings (keys, values, fields): owned (`Vec<u8>`, the default) or
/// borrowed from a frame (`&[u8]`, as [`decode_batch_into`] decodes them, without
/// allocating).
pub type Op<B = Vec<u8>> = flowstate_objects::Op<B, B>;

/// What one operation of a batch asks: an operation of the state API, or one of the two that
/// manage ownership (CHC §5.1), which only this store offers. `B` as in [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<B = Vec<u8>> {
    /// An operation of the state API.
    Op(Op<B>),
    /// Make `instance` the owner of the object (created empty of `kind` if missing): from now
    /// on only operations tagged with that instance may change it. Replies `Bool` (whether it
    /// was granted: the object had no owner or already this one).
    Claim {
        /// The object.
        key: B,
        /// Its kind.
        kind: Kind,
        /// The new owner.
        instance: u32,
    },
    /// Move ownership from `from` to `to` (a flow move, CHC §5.1). Replies `Bool` (whether
    /// `from` owned it).
    Handover {
        /// The object.
        key: B,
        /// The owner now.
        from: u32,
        /// The next owner.
        to: u32,
    },
    /// The batch's condition: the rest of its batch runs only if the value under `key` is
    /// `value` now (a cluster instance's ownership record, its fencing token). Replies `Bool`;
    /// on `false`, every later operation of the batch is refused without running, on every
    /// shard, atomically with the check for the operations in the fence key's shard.
    Fence {
        /// The value that must hold.
        key: B,
        /// What it must hold.
        value: B,
    },
}

/// Opcode of [`Command::Claim`]: the first after the state API's ([`Op::code`]).
const CLAIM: u8 = 22;
/// Opcode of [`Command::Handover`].
const HANDOVER: u8 = 23;
/// Opcode of [`Command::Fence`].
const FENCE: u8 = 24;
const _: () = assert!(flowstate_objects::OP_NAMES.len() == CLAIM as usize);

impl<B> From<Op<B>> for Command<B> {
    fn from(op: Op<B>) -> Self {
        Command::Op(op)
    }
}

/// A command is equal to an operation of the state API when it is that operation.
impl<B: PartialEq> PartialEq<Op<B>> for Command<B> {
    fn eq(&self, other: &Op<B>) -> bool {
        matches!(self, Command::Op(op) if op == other)
    }
}

impl<B: AsRef<[u8]>> Command<B> {
    /// The key of the object the operation is on.
    pub fn key(&self) -> &[u8] {
        match self {
            Command::Op(op) => op.key().as_ref(),
            Command::Claim { key, .. }
            | Command::Handover { key, .. }
            | Command::Fence { key, .. } => key.as_ref(),
        }
    }

    /// The same operation borrowing its byte strings.
    pub fn borrowed(&self) -> Command<&[u8]> {
        self.map_bytes(AsRef::as_ref)
    }

    /// The same operation with each byte string mapped by `f`.
    fn map_bytes<'s, C>(&'s self, mut f: impl FnMut(&'s B) -> C) -> Command<C> {
        match self {
            Command::Op(op) => {
                let key = f(op.key());
                Command::Op(op.map(|_| key, f))
            }
            Command::Claim {
                key,
                kind,
                instance,
            } => Command::Claim {
                key: f(key),
                kind: *kind,
                instance: *instance,
            },
            Command::Handover { key, from, to } => Command::Handover {
                key: f(key),
                from: *from,
                to: *to,
            },
            Command::Fence { key, value } => Command::Fence {
                key: f(key),
                value: f(value),
            },
        }
    }

    /// The wire opcode (also the index of the op type in the server's statistics,
    /// [`OP_NAMES`]).
    pub fn code(&self) -> u8 {
        match self {
            Command::Op(op) => op.code(),
            Command::Claim { .. } => CLAIM,
            Command::Handover { .. } => HANDOVER,
            Command::Fence { .. } => FENCE,
        }
    }

    /// Whether the operation is a read, which never changes an object ([`Op::is_read`]); the
    /// leases and the ownership operations are not reads.
    pub fn is_read(&self) -> bool {
        match self {
            Command::Op(op) => op.is_read(),
            Command::Fence { .. } => true,
            Command::Claim { .. } | Command::Handover { .. } => false,
        }
    }

    /// What the operation does to its object, as [`flowstate_objects`] defines it (the
    /// in-process store's semantics exactly); `None` for the leases and ownership, which the
    /// server keeps beside the objects.
    pub fn action(&self) -> Option<Action<'_>> {
        match self {
            Command::Op(op) => op.action(),
            Command::Claim { .. } | Command::Handover { .. } | Command::Fence { .. } => None,
        }
    }
}

/// Names of the opcodes, indexed by [`Command::code`]: the state API's
/// ([`flowstate_objects::OP_NAMES`]), then `claim`, `handover` and `fence`.
pub const OP_NAMES: [&str; 25] = {
    let state = flowstate_objects::OP_NAMES;
    let mut names = [""; 25];
    let mut i = 0;
    while i < state.len() {
        names[i] = state[i];
        i += 1;
    }
    names[CLAIM as usize] = "claim";
    names[HANDOVER as usize] = "handover";
    names[FENCE as usize] = "fence";
    names
};

/// An operation with its optional tags (`B` as in [`Op`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<B = Vec<u8>> {
    /// The operation.
    pub op: Command<B>,
    /// The NF instance that sends it: checked against the object's owner (CHC §5.1), and the
    /// scope of `clock`.
    pub instance: Option<u32>,
    /// The logical clock of the packet that caused the update (CHC §5.3): a second update
    /// from the same instance with the same clock on the same object is not applied.
    pub clock: Option<u64>,
}

impl<B: AsRef<[u8]>> Request<B> {
    /// The same request borrowing its byte strings.
    pub fn borrowed(&self) -> Request<&[u8]> {
        Request {
            op: self.op.borrowed(),
            instance: self.instance,
            clock: self.clock,
        }
    }

    /// The same request owning its byte strings.
    pub fn owned(&self) -> Request {
        Request {
            op: self.op.map_bytes(|b| b.as_ref().to_vec()),
            instance: self.instance,
            clock: self.clock,
        }
    }
}

impl<B> From<Command<B>> for Request<B> {
    fn from(op: Command<B>) -> Self {
        Request {
            op,
            instance: None,
            clock: None,
        }
    }
}

impl<B> From<Op<B>> for Request<B> {
    fn from(op: Op<B>) -> Self {
        Command::Op(op).into()
    }
}

/// A whole object, as [`Op::ReadAll`] returns it and subscriptions push it.
pub use flowstate_objects::Object;

/// The answer to one operation ([`flowstate_objects::Reply`]), with the protocol's
/// [`Failure`]s.
pub type Reply = flowstate_objects::Reply<Failure>;

/// Why one operation of a batch failed or was not applied; the others ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The key holds another kind.
    WrongKind {
        /// The key.
        key: Vec<u8>,
        /// Kind the operation needs.
        wanted: Kind,
        /// Kind the store holds.
        found: Kind,
    },
    /// The store refused the operation (limit, overflow, ownership...).
    Refused(String),
    /// Not applied: this update was applied before (same instance, object and clock,
    /// CHC §5.3; or a retransmitted batch whose answer was lost in a store restart).
    Duplicate,
}

/// Why the server rejects a frame or a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The frame's version is not [`VERSION`].
    BadVersion = 1,
    /// The frame is longer than [`Limits::max_frame`]; the connection closes.
    TooLarge = 2,
    /// The body does not decode.
    Malformed = 3,
    /// A token is configured and the client has not presented it.
    Unauthorized = 4,
    /// More operations than [`Limits::max_ops`].
    TooManyOps = 5,
    /// A frame kind the receiver does not take.
    UnexpectedKind = 6,
    /// The server cannot serve the request now (shutting down, a shard stopped).
    Unavailable = 7,
    /// The connection limit is reached.
    TooManyConnections = 8,
    /// The connection sent no whole first frame (or no hello with the token) in time, or
    /// nothing for too long; the connection closes.
    TimedOut = 9,
}

impl ErrorCode {
    fn from_code(c: u16) -> Option<ErrorCode> {
        Some(match c {
            1 => ErrorCode::BadVersion,
            2 => ErrorCode::TooLarge,
            3 => ErrorCode::Malformed,
            4 => ErrorCode::Unauthorized,
            5 => ErrorCode::TooManyOps,
            6 => ErrorCode::UnexpectedKind,
            7 => ErrorCode::Unavailable,
            8 => ErrorCode::TooManyConnections,
            9 => ErrorCode::TimedOut,
            _ => return None,
        })
    }
}

/// Something the server pushes without being asked (request id 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// A subscribed object changed; its new value (`None`: deleted). CHC §4.3 callbacks.
    Updated {
        /// The key.
        key: Vec<u8>,
        /// The object now.
        object: Option<Object>,
    },
    /// A subscribed object (or one map field) reached its time to live; sent to exactly one
    /// subscriber (StatelessNF §4.1).
    Expired {
        /// The key.
        key: Vec<u8>,
        /// The map field, or `None` for the whole object.
        field: Option<Vec<u8>>,
    },
}

/// What a frame says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client → server, first frame: who the client is, and the shared token if the server
    /// wants one. Answered by [`Message::Welcome`] or an error.
    Hello {
        /// A client id, stable across reconnects: the scope of op ids.
        client: u64,
        /// The shared token (empty if none).
        token: Vec<u8>,
    },
    /// Server → client: the hello is accepted.
    Welcome {
        /// Shards (threads) the server runs.
        shards: u32,
    },
    /// Client → server: operations run in order per object; one reply each.
    Batch {
        /// Idempotency id, increasing per client; 0: none. A batch whose id the store has
        /// applied already is not applied again.
        op_id: u64,
        /// [`FLAG_ACK_ONLY`]: answer with [`Message::Ack`] only.
        ack_only: bool,
        /// The operations.
        ops: Vec<Request>,
    },
    /// Server → client: one reply per operation of the batch with the same request id.
    Replies(Vec<Reply>),
    /// Server → client: an ack-only batch was applied (and logged, with a data directory).
    Ack {
        /// Whether it had been applied before (a retransmission).
        duplicate: bool,
    },
    /// Server → client: the request (or the connection) failed.
    Error {
        /// Why.
        code: ErrorCode,
        /// Details for humans.
        message: String,
    },
    /// Client → server: server statistics, answered by [`Message::StatsReply`].
    Stats,
    /// Server → client: named numbers (ops/s by type, connections, objects, memory, WAL lag).
    StatsReply(Vec<(String, u64)>),
    /// Client → server: keys of every live partition of object `id` of `kind` of NF `nf`
    /// (`nf@..@Kind@id`); answered by [`Message::Keys`], sorted.
    Partitions {
        /// NF name.
        nf: Vec<u8>,
        /// Kind.
        kind: Kind,
        /// Object id.
        id: Vec<u8>,
    },
    /// Server → client: keys.
    Keys(Vec<Vec<u8>>),
    /// Client → server: push this object's new value on every update by another connection,
    /// and tell this connection (as `instance`) about expiry. Answered by an empty
    /// [`Message::Replies`].
    Subscribe {
        /// The key.
        key: Vec<u8>,
        /// The subscribing instance.
        instance: u32,
    },
    /// Client → server: stop a subscription. Answered by an empty [`Message::Replies`].
    Unsubscribe {
        /// The key.
        key: Vec<u8>,
    },
    /// Server → client, unasked.
    Notify(Notification),
}

impl Message {
    /// The kind byte ([`Header::kind`]) of a [`Message::Replies`] frame.
    pub const REPLIES: u8 = 4;

    fn kind_code(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Welcome { .. } => 2,
            Message::Batch { .. } => 3,
            Message::Replies(_) => Message::REPLIES,
            Message::Ack { .. } => 5,
            Message::Error { .. } => 6,
            Message::Stats => 7,
            Message::StatsReply(_) => 8,
            Message::Partitions { .. } => 9,
            Message::Keys(_) => 10,
            Message::Subscribe { .. } => 11,
            Message::Unsubscribe { .. } => 12,
            Message::Notify(_) => 13,
        }
    }
}

/// One frame: a message and the request id that pairs an answer with its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Request id (0 for pushes).
    pub id: u64,
    /// The message.
    pub msg: Message,
}

/// Why bytes are not a frame. Each maps to the [`ErrorCode`] a server answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The length field is past the limit: the stream cannot be trusted further.
    #[error("frame of {len} bytes is over the limit of {max}")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// Limit.
        max: u32,
    },
    /// The length field is below the header's size.
    #[error("frame length {0} is shorter than a header")]
    TooShort(u32),
    /// Another protocol version.
    #[error("protocol version {0}, expected {VERSION}")]
    BadVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// More operations than allowed.
    #[error("batch of {n} operations is over the limit of {max}")]
    TooManyOps {
        /// Announced count.
        n: u32,
        /// Limit.
        max: u32,
    },
    /// The body is wrong.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

impl DecodeError {
    /// The error code a server answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::TooLarge { .. } | DecodeError::TooShort(_) => ErrorCode::TooLarge,
            DecodeError::BadVersion(_) => ErrorCode::BadVersion,
            DecodeError::UnknownKind(_) => ErrorCode::UnexpectedKind,
            DecodeError::TooManyOps { .. } => ErrorCode::TooManyOps,
            DecodeError::Malformed(_) => ErrorCode::Malformed,
        }
    }

    /// Whether the stream can go on after this frame (its length was sound, so the next frame
    /// starts where this one ends).
    pub fn recoverable(&self) -> bool {
        !matches!(
            self,
            DecodeError::TooLarge { .. } | DecodeError::TooShort(_)
        )
    }
}

/// The header of a frame, readable before its body arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes of the whole frame, header included.
    pub total: usize,
    /// Version byte.
    pub version: u8,
    /// Kind byte.
    pub kind: u8,
    /// Flags.
    pub flags: u16,
    /// Request id.
    pub id: u64,
}

/// Reads a header from the first [`HEADER_LEN`] bytes of `buf`; `Ok(None)` if fewer are there.
/// Checks the length against `limits` (the version is checked by [`decode_body`]).
pub fn peek_header(buf: &[u8], limits: &Limits) -> Result<Option<Header>, DecodeError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        // The length alone can be judged as soon as it is there.
        if let Some(l) = buf.get(..4) {
            check_len(u32::from_le_bytes([l[0], l[1], l[2], l[3]]), limits)?;
        }
        return Ok(None);
    };
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    check_len(len, limits)?;
    Ok(Some(Header {
        total: 4 + len as usize,
        version: h[4],
        kind: h[5],
        flags: u16::from_le_bytes([h[6], h[7]]),
        id: u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
    }))
}

fn check_len(len: u32, limits: &Limits) -> Result<(), DecodeError> {
    if len < (HEADER_LEN - 4) as u32 {
        return Err(DecodeError::TooShort(len));
    }
    if len > limits.max_frame {
        return Err(DecodeError::TooLarge {
            len: u64::from(len),
            max: limits.max_frame,
        });
    }
    Ok(())
}

/// Decodes the first frame of `buf`: `Ok(None)` if it is not all there yet, else the frame and
/// the bytes it took.
pub fn decode(buf: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, DecodeError> {
    let Some(h) = peek_header(buf, limits)? else {
        return Ok(None);
    };
    let Some(whole) = buf.get(..h.total) else {
        return Ok(None);
    };
    let msg = decode_body(&h, &whole[HEADER_LEN..], limits)?;
    Ok(Some((Frame { id: h.id, msg }, h.total)))
}

/// Decodes the body of a frame whose header is `h`.
pub fn decode_body(h: &Header, body: &[u8], limits: &Limits) -> Result<Message, DecodeError> {
    if h.version != VERSION {
        return Err(DecodeError::BadVersion(h.version));
    }
    let mut r = Rd { buf: body };
    let msg = match h.kind {
        1 => Message::Hello {
            client: r.u64()?,
            token: r.bytes()?.to_vec(),
        },
        2 => Message::Welcome { shards: r.u32()? },
        3 => {
            let mut ops = Vec::new();
            let (op_id, ack_only) = decode_batch_into(h, body, limits, &mut ops)?;
            return Ok(Message::Batch {
                op_id,
                ack_only,
                ops: ops.iter().map(Request::owned).collect(),
            });
        }
        Message::REPLIES => {
            let n = r.u32()? as usize;
            let mut replies = Vec::with_capacity(n.min(r.buf.len()));
            for _ in 0..n {
                replies.push(r.reply()?);
            }
            Message::Replies(replies)
        }
        5 => Message::Ack {
            duplicate: r.bool()?,
        },
        6 => {
            let code = r.u16()?;
            Message::Error {
                code: ErrorCode::from_code(code).ok_or(DecodeError::Malformed("error code"))?,
                message: String::from_utf8_lossy(r.bytes()?).into_owned(),
            }
        }
        7 => Message::Stats,
        8 => {
            let n = r.u32()? as usize;
            let mut v = Vec::with_capacity(n.min(r.buf.len() / 12));
            for _ in 0..n {
                let name = std::str::from_utf8(r.bytes()?)
                    .map_err(|_| DecodeError::Malformed("stat name is not UTF-8"))?;
                v.push((name.to_owned(), r.u64()?));
            }
            Message::StatsReply(v)
        }
        9 => Message::Partitions {
            nf: r.bytes()?.to_vec(),
            kind: r.kind()?,
            id: r.bytes()?.to_vec(),
        },
        10 => {
            let n = r.u32()? as usize;
            let mut v = Vec::with_capacity(n.min(r.buf.len() / 4));
            for _ in 0..n {
                v.push(r.bytes()?.to_vec());
            }
            Message::Keys(v)
        }
        11 => Message::Subscribe {
            key: r.bytes()?.to_vec(),
            instance: r.u32()?,
        },
        12 => Message::Unsubscribe {
            key: r.bytes()?.to_vec(),
        },
        13 => Message::Notify(match r.u8()? {
            0 => Notification::Updated {
                key: r.bytes()?.to_vec(),
                object: r.opt_object()?,
            },
            1 => Notification::Expired {
                key: r.bytes()?.to_vec(),
                field: r.opt_bytes()?,
            },
            _ => return Err(DecodeError::Malformed("notification tag")),
        }),
        k => return Err(DecodeError::UnknownKind(k)),
    };
    if !r.buf.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after the body"));
    }
    Ok(msg)
}

/// Decodes the body of a batch frame (kind 3, as [`decode_body`] does) into `ops`, which is
/// cleared first and whose allocation is reused: a server's hot path. The operations borrow
/// their byte strings from `body` (nothing is copied). Returns the batch's op id and whether
/// it is ack-only; on an error `ops` holds no operation of the frame that is to be trusted.
pub fn decode_batch_into<'a>(
    h: &Header,
    body: &'a [u8],
    limits: &Limits,
    ops: &mut Vec<Request<&'a [u8]>>,
) -> Result<(u64, bool), DecodeError> {
    if h.version != VERSION {
        return Err(DecodeError::BadVersion(h.version));
    }
    if h.kind != 3 {
        return Err(DecodeError::UnknownKind(h.kind));
    }
    ops.clear();
    let mut r = Rd { buf: body };
    let op_id = r.u64()?;
    let n = r.u32()?;
    if n > limits.max_ops {
        return Err(DecodeError::TooManyOps {
            n,
            max: limits.max_ops,
        });
    }
    // Each op takes at least 6 bytes: never reserve more than the body can hold.
    ops.reserve((n as usize).min(r.buf.len() / 6));
    for _ in 0..n {
        ops.push(r.request_ref()?);
    }
    if !r.buf.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes after the body"));
    }
    Ok((op_id, h.flags & FLAG_ACK_ONLY != 0))
}

/// Appends `frame` to `out` (which the caller reuses).
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    let flags = match &frame.msg {
        Message::Batch { ack_only: true, .. } => FLAG_ACK_ONLY,
        _ => 0,
    };
    let start = begin(out, frame.msg.kind_code(), flags, frame.id);
    let w = out;
    match &frame.msg {
        Message::Hello { client, token } => {
            put_u64(w, *client);
            put_bytes(w, token);
        }
        Message::Welcome { shards } => put_u32(w, *shards),
        Message::Batch { op_id, ops, .. } => {
            put_u64(w, *op_id);
            put_u32(w, len32(ops.len()));
            for r in ops {
                put_request(w, &r.op, r.instance, r.clock);
            }
        }
        Message::Replies(replies) => {
            put_u32(w, len32(replies.len()));
            for r in replies {
                put_reply(w, r);
            }
        }
        Message::Ack { duplicate } => w.push(u8::from(*duplicate)),
        Message::Error { code, message } => {
            put_u16(w, *code as u16);
            put_bytes(w, message.as_bytes());
        }
        Message::Stats => {}
        Message::StatsReply(v) => {
            put_u32(w, len32(v.len()));
            for (name, n) in v {
                put_bytes(w, name.as_bytes());
                put_u64(w, *n);
            }
        }
        Message::Partitions { nf, kind, id } => {
            put_bytes(w, nf);
            w.push(*kind as u8);
            put_bytes(w, id);
        }
        Message::Keys(v) => {
            put_u32(w, len32(v.len()));
            for k in v {
                put_bytes(w, k);
            }
        }
        Message::Subscribe { key, instance } => {
            put_bytes(w, key);
            put_u32(w, *instance);
        }
        Message::Unsubscribe { key } => put_bytes(w, key),
        Message::Notify(Notification::Updated { key, object }) => {
            w.push(0);
            put_bytes(w, key);
            put_opt_object(w, object.as_ref());
        }
        Message::Notify(Notification::Expired { key, field }) => {
            w.push(1);
            put_bytes(w, key);
            put_opt_bytes(w, field.as_deref());
        }
    }
    finish(w, start);
}

/// Starts a frame of `kind` in `out`; returns where it starts. Finish it with [`finish`].
/// For encoders that write a batch's operations as they hold them ([`begin_batch`] and
/// [`put_request`]) without building a [`Message::Batch`].
pub fn begin(out: &mut Vec<u8>, kind: u8, flags: u16, id: u64) -> usize {
    let start = out.len();
    // The header in one append (the length is written by `finish`).
    let mut h = [0; HEADER_LEN];
    h[4] = VERSION;
    h[5] = kind;
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..].copy_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&h);
    start
}

/// Starts a batch frame with `count` operations to follow (each written by [`put_request`]).
pub fn begin_batch(out: &mut Vec<u8>, id: u64, op_id: u64, ack_only: bool, count: u32) -> usize {
    let start = begin(out, 3, if ack_only { FLAG_ACK_ONLY } else { 0 }, id);
    put_u64(out, op_id);
    put_u32(out, count);
    start
}

/// Writes the length of the frame started at `start`.
pub fn finish(out: &mut [u8], start: usize) {
    let len = len32(out.len() - start - 4);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Appends a little-endian field (see the frame diagram).
pub fn put_u16(w: &mut Vec<u8>, v: u16) {
    w.extend_from_slice(&v.to_le_bytes());
}
/// Appends a little-endian field (see the frame diagram).
pub fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}
/// Appends a little-endian field (see the frame diagram).
pub fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}
/// Appends a little-endian field (see the frame diagram).
pub fn put_i64(w: &mut Vec<u8>, v: i64) {
    w.extend_from_slice(&v.to_le_bytes());
}
/// Appends a little-endian field (see the frame diagram).
pub fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    put_u32(w, len32(b.len()));
    w.extend_from_slice(b);
}
/// Appends a little-endian field (see the frame diagram).
pub fn put_opt_bytes(w: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => w.push(0),
        Some(b) => {
            w.push(1);
            put_bytes(w, b);
        }
    }
}
/// Appends a little-endian field (see the frame diagram).
pub fn put_duration(w: &mut Vec<u8>, d: Duration) {
    put_u64(w, u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

/// An operation [`put_request`] writes: a [`Command`], or an operation of the state API
/// ([`flowstate_objects::Op`]) whose key and byte strings are any bytes (the state API's object
/// keys and encoded values, written as they are, without building a [`Command`]).
pub trait Encode {
    /// Writes the operation: opcode, tags, key and arguments.
    fn put(&self, w: &mut Vec<u8>, instance: Option<u32>, clock: Option<u64>);
}

/// Writes one operation with its tags.
pub fn put_request<O: Encode + ?Sized>(
    w: &mut Vec<u8>,
    op: &O,
    instance: Option<u32>,
    clock: Option<u64>,
) {
    op.put(w, instance, clock);
}

/// Writes what every operation starts with: its opcode, its tags and its key.
fn put_head(w: &mut Vec<u8>, code: u8, key: &[u8], instance: Option<u32>, clock: Option<u64>) {
    w.push(code);
    let meta = if instance.is_some() { META_INSTANCE } else { 0 }
        | if clock.is_some() { META_CLOCK } else { 0 };
    w.push(meta);
    if let Some(i) = instance {
        put_u32(w, i);
    }
    if let Some(c) = clock {
        put_u64(w, c);
    }
    put_bytes(w, key);
}

impl<K: AsRef<[u8]>, B: AsRef<[u8]>> Encode for flowstate_objects::Op<K, B> {
    fn put(&self, w: &mut Vec<u8>, instance: Option<u32>, clock: Option<u64>) {
        use flowstate_objects::Op;
        put_head(w, self.code(), self.key().as_ref(), instance, clock);
        match self {
            Op::Get { .. } | Op::Delete { .. } | Op::GetCounter { .. } | Op::Pop { .. } => {}
            Op::Set { value, .. } => put_bytes(w, value.as_ref()),
            Op::Add { delta, .. } => put_i64(w, *delta),
            Op::SetCounter { value, .. } => put_i64(w, *value),
            Op::Push { item, .. } => put_bytes(w, item.as_ref()),
            Op::Insert { member, .. } | Op::Remove { member, .. } | Op::Contains { member, .. } => {
                put_bytes(w, member.as_ref())
            }
            Op::MapGet { field, .. }
            | Op::MapDelete { field, .. }
            | Op::MapGetCounter { field, .. } => put_bytes(w, field.as_ref()),
            Op::MapSet { field, value, .. } => {
                put_bytes(w, field.as_ref());
                put_bytes(w, value.as_ref());
            }
            Op::MapAdd { field, delta, .. } => {
                put_bytes(w, field.as_ref());
                put_i64(w, *delta);
            }
            Op::CompareAndSet { expected, new, .. } => {
                put_opt_bytes(w, expected.as_ref().map(AsRef::as_ref));
                put_opt_bytes(w, new.as_ref().map(AsRef::as_ref));
            }
            Op::Expire { field, ttl, .. } => {
                put_opt_bytes(w, field.as_ref().map(AsRef::as_ref));
                put_duration(w, *ttl);
            }
            Op::Len { kind, .. } | Op::ReadAll { kind, .. } => w.push(*kind as u8),
            Op::Lock { owner, lease, .. } => {
                put_u64(w, *owner);
                put_duration(w, *lease);
            }
            Op::Unlock { owner, .. } => put_u64(w, *owner),
        }
    }
}

impl<B: AsRef<[u8]>> Encode for Command<B> {
    fn put(&self, w: &mut Vec<u8>, instance: Option<u32>, clock: Option<u64>) {
        match self {
            Command::Op(op) => op.put(w, instance, clock),
            Command::Claim {
                key,
                kind,
                instance: owner,
            } => {
                put_head(w, CLAIM, key.as_ref(), instance, clock);
                w.push(*kind as u8);
                put_u32(w, *owner);
            }
            Command::Handover { key, from, to } => {
                put_head(w, HANDOVER, key.as_ref(), instance, clock);
                put_u32(w, *from);
                put_u32(w, *to);
            }
            Command::Fence { key, value } => {
                put_head(w, FENCE, key.as_ref(), instance, clock);
                put_bytes(w, value.as_ref());
            }
        }
    }
}

/// Writes one reply.
pub fn put_reply(w: &mut Vec<u8>, r: &Reply) {
    // The common replies in one append each (the hot path of a server).
    let tagged = |tag: u8, v: [u8; 8]| {
        let mut a = [tag; 9];
        a[1..].copy_from_slice(&v);
        a
    };
    match r {
        Reply::Done => w.push(0),
        Reply::Value(None) => w.extend_from_slice(&[1, 0]),
        Reply::Value(Some(v)) => {
            let n = len32(v.len()).to_le_bytes();
            w.reserve(6 + v.len());
            w.extend_from_slice(&[1, 1, n[0], n[1], n[2], n[3]]);
            w.extend_from_slice(v);
        }
        Reply::Int(i) => w.extend_from_slice(&tagged(2, i.to_le_bytes())),
        Reply::Bool(b) => w.extend_from_slice(&[3, u8::from(*b)]),
        Reply::Len(n) => w.extend_from_slice(&tagged(4, n.to_le_bytes())),
        Reply::Object(o) => {
            w.push(5);
            put_opt_object(w, o.as_ref());
        }
        Reply::Error(Failure::WrongKind { key, wanted, found }) => {
            w.push(6);
            put_bytes(w, key);
            w.push(*wanted as u8);
            w.push(*found as u8);
        }
        Reply::Error(Failure::Refused(msg)) => {
            w.push(7);
            put_bytes(w, msg.as_bytes());
        }
        Reply::Error(Failure::Duplicate) => w.push(8),
    }
}

/// The bytes [`put_reply`] writes for `r`.
pub fn reply_len(r: &Reply) -> usize {
    let bytes = |b: &[u8]| 4 + b.len();
    match r {
        Reply::Done | Reply::Error(Failure::Duplicate) => 1,
        Reply::Value(None) | Reply::Bool(_) => 2,
        Reply::Value(Some(v)) => 2 + bytes(v),
        Reply::Int(_) | Reply::Len(_) => 9,
        Reply::Object(None) => 2,
        Reply::Object(Some(o)) => {
            3 + match o {
                Object::Value(v) => bytes(v),
                Object::Counter(_) => 8,
                Object::List(v) | Object::Set(v) => 4 + v.iter().map(|x| bytes(x)).sum::<usize>(),
                Object::Map(v) => 4 + v.iter().map(|(f, x)| bytes(f) + bytes(x)).sum::<usize>(),
                Object::CounterMap(v) => 4 + v.iter().map(|(f, _)| bytes(f) + 8).sum::<usize>(),
            }
        }
        Reply::Error(Failure::WrongKind { key, .. }) => 3 + bytes(key),
        Reply::Error(Failure::Refused(msg)) => 1 + bytes(msg.as_bytes()),
    }
}

/// Writes an optional object (as in replies and notifications).
pub fn put_opt_object(w: &mut Vec<u8>, o: Option<&Object>) {
    let Some(o) = o else {
        w.push(0);
        return;
    };
    w.push(1);
    w.push(o.kind() as u8);
    match o {
        Object::Value(v) => put_bytes(w, v),
        Object::Counter(c) => put_i64(w, *c),
        Object::List(v) | Object::Set(v) => {
            put_u32(w, len32(v.len()));
            for x in v {
                put_bytes(w, x);
            }
        }
        Object::Map(v) => {
            put_u32(w, len32(v.len()));
            for (f, x) in v {
                put_bytes(w, f);
                put_bytes(w, x);
            }
        }
        Object::CounterMap(v) => {
            put_u32(w, len32(v.len()));
            for (f, c) in v {
                put_bytes(w, f);
                put_i64(w, *c);
            }
        }
    }
}

/// A reader over a body: every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Rd<'a> {
    /// What is left to read.
    pub buf: &'a [u8],
}

impl<'a> Rd<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Rd { buf }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Malformed("truncated"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    /// A boolean byte.
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Malformed("boolean")),
        }
    }
    /// A u16.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    /// A u32.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    /// A u64.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    /// An i64.
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    /// Length-prefixed bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// Optional length-prefixed bytes.
    pub fn opt_bytes(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        Ok(self.opt_slice()?.map(<[u8]>::to_vec))
    }
    /// Optional length-prefixed bytes, borrowed.
    pub fn opt_slice(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        Ok(match self.u8()? {
            0 => None,
            1 => Some(self.bytes()?),
            _ => return Err(DecodeError::Malformed("option tag")),
        })
    }
    /// An object kind.
    pub fn kind(&mut self) -> Result<Kind, DecodeError> {
        Kind::from_code(self.u8()?).ok_or(DecodeError::Malformed("object kind"))
    }
    /// A duration in nanoseconds.
    pub fn duration(&mut self) -> Result<Duration, DecodeError> {
        Ok(Duration::from_nanos(self.u64()?))
    }
    /// A count of items of at least `min_item` bytes each, checked against what is left.
    pub fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.buf.len() {
            return Err(DecodeError::Malformed("count past the end of the frame"));
        }
        Ok(n)
    }

    /// One operation with its tags, owning its byte strings.
    pub fn request(&mut self) -> Result<Request, DecodeError> {
        Ok(self.request_ref()?.owned())
    }

    /// One operation with its tags, its byte strings borrowed from the buffer (no
    /// allocation).
    pub fn request_ref(&mut self) -> Result<Request<&'a [u8]>, DecodeError> {
        let code = self.u8()?;
        let meta = self.u8()?;
        if meta & !(META_INSTANCE | META_CLOCK) != 0 {
            return Err(DecodeError::Malformed("operation tags"));
        }
        let instance = if meta & META_INSTANCE != 0 {
            Some(self.u32()?)
        } else {
            None
        };
        let clock = if meta & META_CLOCK != 0 {
            Some(self.u64()?)
        } else {
            None
        };
        let key = self.bytes()?;
        let op = match code {
            CLAIM => Command::Claim {
                key,
                kind: self.kind()?,
                instance: self.u32()?,
            },
            HANDOVER => Command::Handover {
                key,
                from: self.u32()?,
                to: self.u32()?,
            },
            FENCE => Command::Fence {
                key,
                value: self.bytes()?,
            },
            _ => Command::Op(self.op(code, key)?),
        };
        Ok(Request {
            op,
            instance,
            clock,
        })
    }

    /// The arguments of the state API's operation with opcode `code` ([`Op::code`]) on `key`,
    /// borrowed from the buffer. Always inlined into [`Rd::request_ref`], the server's hot
    /// path: one jump on the opcode then builds the operation in place, where a call returns
    /// it to be moved into its [`Command`] (a batch decodes in about two thirds of the time).
    #[inline(always)]
    fn op(&mut self, code: u8, key: &'a [u8]) -> Result<Op<&'a [u8]>, DecodeError> {
        let b = |r: &mut Self| r.bytes();
        Ok(match code {
            0 => Op::Get { key },
            1 => Op::Set {
                key,
                value: b(self)?,
            },
            2 => Op::Delete { key },
            3 => Op::Add {
                key,
                delta: self.i64()?,
            },
            4 => Op::GetCounter { key },
            5 => Op::SetCounter {
                key,
                value: self.i64()?,
            },
            6 => Op::Push {
                key,
                item: b(self)?,
            },
            7 => Op::Pop { key },
            8 => Op::Insert {
                key,
                member: b(self)?,
            },
            9 => Op::Remove {
                key,
                member: b(self)?,
            },
            10 => Op::Contains {
                key,
                member: b(self)?,
            },
            11 => Op::MapGet {
                key,
                field: b(self)?,
            },
            12 => Op::MapSet {
                key,
                field: b(self)?,
                value: b(self)?,
            },
            13 => Op::MapDelete {
                key,
                field: b(self)?,
            },
            14 => Op::MapAdd {
                key,
                field: b(self)?,
                delta: self.i64()?,
            },
            15 => Op::MapGetCounter {
                key,
                field: b(self)?,
            },
            16 => Op::CompareAndSet {
                key,
                expected: self.opt_slice()?,
                new: self.opt_slice()?,
            },
            17 => Op::Expire {
                key,
                field: self.opt_slice()?,
                ttl: self.duration()?,
            },
            18 => Op::Len {
                key,
                kind: self.kind()?,
            },
            19 => Op::ReadAll {
                key,
                kind: self.kind()?,
            },
            20 => Op::Lock {
                key,
                owner: self.u64()?,
                lease: self.duration()?,
            },
            21 => Op::Unlock {
                key,
                owner: self.u64()?,
            },
            _ => return Err(DecodeError::Malformed("unknown opcode")),
        })
    }

    fn reply(&mut self) -> Result<Reply, DecodeError> {
        Ok(match self.u8()? {
            0 => Reply::Done,
            1 => Reply::Value(self.opt_bytes()?),
            2 => Reply::Int(self.i64()?),
            3 => Reply::Bool(self.bool()?),
            4 => Reply::Len(self.u64()?),
            5 => Reply::Object(self.opt_object()?),
            6 => Reply::Error(Failure::WrongKind {
                key: self.bytes()?.to_vec(),
                wanted: self.kind()?,
                found: self.kind()?,
            }),
            7 => Reply::Error(Failure::Refused(
                String::from_utf8_lossy(self.bytes()?).into_owned(),
            )),
            8 => Reply::Error(Failure::Duplicate),
            _ => return Err(DecodeError::Malformed("reply tag")),
        })
    }

    /// An optional object.
    pub fn opt_object(&mut self) -> Result<Option<Object>, DecodeError> {
        if !self.bool()? {
            return Ok(None);
        }
        let kind = self.kind()?;
        let bytes_list = |r: &mut Self| -> Result<Vec<Vec<u8>>, DecodeError> {
            let n = r.count(4)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(r.bytes()?.to_vec());
            }
            Ok(v)
        };
        Ok(Some(match kind {
            Kind::Value => Object::Value(self.bytes()?.to_vec()),
            Kind::Counter => Object::Counter(self.i64()?),
            Kind::List => Object::List(bytes_list(self)?),
            Kind::Set => Object::Set(bytes_list(self)?),
            Kind::Map => {
                let n = self.count(8)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push((self.bytes()?.to_vec(), self.bytes()?.to_vec()));
                }
                Object::Map(v)
            }
            Kind::CounterMap => {
                let n = self.count(12)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push((self.bytes()?.to_vec(), self.i64()?));
                }
                Object::CounterMap(v)
            }
        }))
    }
}

/// CRC-32C (Castagnoli, RFC 3720 §12.1) of `data`, continuing from `crc` (0 to start): checks
/// the records of the store's write-ahead log and checkpoints. [`flowstate_wire::hash`]'s, so
/// the workspace keeps one CRC implementation (the CPU's instruction where there is one).
#[inline]
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    flowstate_wire::hash::crc32c_append(crc, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // RFC 3720 B.4: CRC-32C of "123456789".
        assert_eq!(crc32c(0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn header_layout_is_as_documented() {
        let mut out = Vec::new();
        encode(
            &Frame {
                id: 0x0102_0304_0506_0708,
                msg: Message::Stats,
            },
            &mut out,
        );
        assert_eq!(out, [12, 0, 0, 0, VERSION, 7, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn oversize_and_short_lengths_are_refused_from_the_length_alone() {
        let l = Limits {
            max_frame: 100,
            max_ops: 10,
        };
        assert!(matches!(
            peek_header(&101u32.to_le_bytes(), &l),
            Err(DecodeError::TooLarge { len: 101, .. })
        ));
        assert!(matches!(
            peek_header(&3u32.to_le_bytes(), &l),
            Err(DecodeError::TooShort(3))
        ));
        assert_eq!(peek_header(&50u32.to_le_bytes(), &l), Ok(None));
    }

    #[test]
    fn bad_version_is_recoverable_and_named() {
        let mut out = Vec::new();
        encode(
            &Frame {
                id: 9,
                msg: Message::Stats,
            },
            &mut out,
        );
        out[4] = 77;
        let e = decode(&out, &Limits::default()).unwrap_err();
        assert_eq!(e, DecodeError::BadVersion(77));
        assert!(e.recoverable());
        assert_eq!(e.code(), ErrorCode::BadVersion);
    }

    #[test]
    fn too_many_ops_is_refused_before_reading_them() {
        let mut out = Vec::new();
        let start = begin_batch(&mut out, 1, 0, false, 1_000_000);
        finish(&mut out, start);
        let e = decode(&out, &Limits::default()).unwrap_err();
        assert!(matches!(e, DecodeError::TooManyOps { n: 1_000_000, .. }));
    }
}
