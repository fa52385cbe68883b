//! The `store` backend: the client of flowstate's own state store (`flowstate store`,
//! `flowstate-store`), speaking `flowstate-proto`.
//!
//! ```no_run
//! use flowstate_driver_store::StoreConnector;
//! use flowstate_state::Connector;
//!
//! let connector = StoreConnector::new("127.0.0.1:7878");
//! let mut backend = connector.connect().unwrap();
//! ```
//!
//! Promises:
//! * Passes the backend conformance suite (`flowstate_state::conformance`) against a live
//!   server with exact options.
//! * **Batching and pipelining** (StatelessNF §5.3): one [`Backend::execute`] call sends its
//!   operations as multi-op frames of at most [`Settings::max_batch`] operations, all written
//!   before any answer is read, in one `write`. The encode and read buffers are kept and
//!   reused; operations are encoded straight from the state API's types, not copied.
//! * **Exactly once across reconnects**: every batch carries this client's id and an
//!   increasing op id. If the connection breaks, the driver reconnects with exponential
//!   backoff (for up to [`Settings::retry_for`]) and sends the unanswered batches again with
//!   the same ids; the store answers a batch it had applied as it did the first time and does
//!   not apply it again. After `retry_for` the call fails with
//!   [`BackendError::Unreachable`]; the state engine keeps serving from its caches and the
//!   next flush catches up.
//! * **CHC extensions** ([`StoreBackend`]'s own methods): clock-tagged updates with duplicate
//!   suppression (CHC §5.3), ownership claims and handover (CHC §5.1), non-blocking updates
//!   retransmitted until acknowledged (CHC §4.3), subscriptions with pushed values (CHC §4.3)
//!   and expiry notifications (StatelessNF §4.1), and the server's statistics.
//! * **TLS and the token**: with [`Settings::ca_file`] (`[state] ca_file`) every connection is
//!   TLS (rustls, TLS 1.2 or 1.3), the store's certificate checked against that CA and the
//!   host of `url` (an IP address or a DNS name in its subject alternative names); never plain
//!   TCP instead. The token (`token`, or `token_file` to keep it out of the configuration)
//!   goes in the first frame, inside TLS. A certificate not trusted, a TLS store reached
//!   without TLS (the store says so) or a plain one with it fails at once, without retrying;
//!   [`StoreConnector::check`] names the `[state]` key to fix: `ca_file`, `token` (or
//!   `token_file`), or `url` for a store that does not answer within `timeout`.

use flowstate_config::Secret;
use flowstate_proto::{
    self as proto, Command, ErrorCode, Failure, Frame, Limits, Message, Notification,
};
use flowstate_state::{
    Backend, BackendError, Connector, Fence, Kind, Object, ObjectKey, Op, OpError, Reply,
    SettingError,
};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const NAME: &str = "store";

/// How a [`StoreConnector`] connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `host:port` of the store.
    pub addr: String,
    /// The shared token, if the store wants one (never printed).
    pub token: Option<Secret>,
    /// How long one connection attempt, and one wait for an answer, may take.
    pub timeout: Duration,
    /// How long a call keeps reconnecting before it fails.
    pub retry_for: Duration,
    /// Most operations per frame.
    pub max_batch: usize,
    /// How long an unacknowledged non-blocking batch waits before it is sent again.
    pub retransmit_after: Duration,
    /// Connect with TLS, trusting the certificates of this PEM file (`ca_file`); `None`:
    /// plain TCP.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            addr: format!("127.0.0.1:{}", proto::DEFAULT_PORT),
            token: None,
            timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(30),
            max_batch: 4096,
            retransmit_after: Duration::from_millis(200),
            ca_file: None,
        }
    }
}

/// Opens connections to one store.
#[derive(Debug, Clone)]
pub struct StoreConnector {
    settings: Settings,
    /// The TLS configuration made from [`Settings::ca_file`].
    tls: TlsSetup,
    /// The `[state]` key the token came from (`token` or `token_file`), for errors.
    token_key: &'static str,
}

impl StoreConnector {
    /// A connector to the store at `addr` (`host:port`) with default settings.
    pub fn new(addr: impl Into<String>) -> Self {
        StoreConnector {
            settings: Settings {
                addr: addr.into(),
                ..Settings::default()
            },
            tls: TlsSetup::Plain,
            token_key: "token",
        }
    }

    /// A connector with these settings. A [`Settings::ca_file`] that cannot be read fails
    /// every connection attempt (as [`BackendError::Protocol`], never plain TCP instead); use
    /// [`StoreConnector::with_tls_settings`] to be told at once.
    pub fn with_settings(settings: Settings) -> Self {
        let tls = match &settings.ca_file {
            Some(path) => match client_tls(path) {
                Ok(c) => TlsSetup::Tls(c),
                Err(e) => TlsSetup::Broken(e.to_string()),
            },
            None => TlsSetup::Plain,
        };
        StoreConnector {
            settings,
            tls,
            token_key: "token",
        }
    }

    /// A connector with these settings, its [`Settings::ca_file`] read now: an error names
    /// `ca_file`.
    pub fn with_tls_settings(settings: Settings) -> Result<Self, SettingError> {
        let tls = match &settings.ca_file {
            Some(path) => TlsSetup::Tls(client_tls(path)?),
            None => TlsSetup::Plain,
        };
        Ok(StoreConnector {
            settings,
            tls,
            token_key: "token",
        })
    }

    /// Builds a connector from `[state]`: its `url` (default `127.0.0.1:7878`; a
    /// `store://` or `tcp://` prefix is accepted) and the driver's own keys, given as text:
    /// `token` (or `token_file`, whose first line is the token), `timeout` and `retry` (durations with their unit, like `"500ms"`, `"5s"`),
    /// `max_batch`, `ca_file` (connect with TLS, trusting this PEM file's certificates; the
    /// store's certificate must name the host of `url`).
    pub fn from_config<'a>(
        url: Option<&str>,
        options: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, SettingError> {
        let mut s = Settings::default();
        let mut token_key = "token";
        if let Some(url) = url {
            let addr = url
                .strip_prefix("store://")
                .or_else(|| url.strip_prefix("tcp://"))
                .unwrap_or(url)
                .trim_end_matches('/');
            let ok = addr
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(SettingError::new(
                    "url",
                    format!("expected host:port of a flowstate store (e.g. 127.0.0.1:7878), got {url:?}"),
                ));
            }
            s.addr = addr.to_owned();
        }
        for (key, value) in options {
            match key {
                "token" => {
                    if value.is_empty() {
                        return Err(SettingError::new("token", "expected a non-empty token"));
                    }
                    s.token = Some(Secret::new(value));
                }
                "token_file" => {
                    let text = flowstate_config::read_text(value)
                        .map_err(|e| SettingError::new(key, format!("{value}: {e}")))?;
                    match text.lines().next() {
                        Some(t) if !t.is_empty() => {
                            s.token = Some(Secret::new(t));
                            token_key = "token_file";
                        }
                        _ => {
                            return Err(SettingError::new(
                                key,
                                format!("{value}: empty (the token is its first line)"),
                            ))
                        }
                    }
                }
                "timeout" => s.timeout = duration(value).map_err(|r| SettingError::new(key, r))?,
                "retry" => s.retry_for = duration(value).map_err(|r| SettingError::new(key, r))?,
                "ca_file" => {
                    if value.trim().is_empty() {
                        return Err(SettingError::new(key, "expected the path of a PEM file"));
                    }
                    s.ca_file = Some(value.into());
                }
                "max_batch" => {
                    s.max_batch = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=65_536).contains(n))
                        .ok_or_else(|| {
                            SettingError::new(
                                key,
                                "expected a number of operations from 1 to 65536",
                            )
                        })?
                }
                other => return Err(SettingError::new(
                    other,
                    "unknown key; backend \"store\" takes url, token, token_file, timeout, retry, max_batch and ca_file",
                )),
            }
        }
        let mut c = StoreConnector::with_tls_settings(s)?;
        c.token_key = token_key;
        Ok(c)
    }

    /// Connects once and names the `[state]` key that is wrong if that fails: `token` for a
    /// refused token, `ca_file` for a store certificate not trusted (or a TLS store reached
    /// without TLS, or the other way round), `url` for a store that does not answer (within
    /// `timeout`).
    pub fn check(&self) -> Result<(), SettingError> {
        let e = match self.open() {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let text = e.to_string();
        let key = match &e {
            BackendError::Unreachable { .. } => "url",
            BackendError::Protocol { reason, .. } if reason.starts_with("TLS") => "ca_file",
            BackendError::Protocol { reason, .. } if reason.contains("serves TLS only") => {
                "ca_file"
            }
            BackendError::Protocol { reason, .. } if reason.contains("Unauthorized") => {
                self.token_key
            }
            BackendError::Protocol { .. }
            | BackendError::Fenced { .. }
            | BackendError::Partial { .. } => "url",
        };
        let hint = match key {
            "token" | "token_file" if self.settings.token.is_none() => " (the store wants a token)",
            "ca_file" if matches!(self.tls, TlsSetup::Plain) && !text.contains("ca_file") => {
                " (the store serves TLS: give ca_file, the CA of its certificate)"
            }
            _ => "",
        };
        Err(SettingError::new(key, format!("{text}{hint}")))
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A new connection with the driver's own API (what [`Connector::connect`] boxes).
    pub fn open(&self) -> Result<StoreBackend, BackendError> {
        let mut b = StoreBackend {
            settings: self.settings.clone(),
            tls: self.tls.clone(),
            client: client_id(),
            next_op: 1,
            next_req: 1,
            conn: None,
            out: Vec::with_capacity(64 * 1024),
            sent: Vec::new(),
            answers: Vec::new(),
            control_answer: None,
            unacked: VecDeque::new(),
            notes: VecDeque::new(),
            limits: Limits::default(),
        };
        b.ensure(Instant::now() + self.settings.timeout)?;
        Ok(b)
    }
}

/// A duration with its unit (`500ms`, `5s`, `2m`: [`flowstate_config::parse_duration`]).
/// A bare number, which meant milliseconds here before, is refused with the string it meant.
fn duration(s: &str) -> Result<Duration, String> {
    if flowstate_config::is_bare_number(s) {
        return Err(flowstate_config::unit_needed_in(s.trim(), "ms"));
    }
    flowstate_config::parse_duration(s)
}

/// A client id unique enough across processes and connections: time, pid and a counter.
fn client_id() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let x = t
        ^ (u64::from(std::process::id()) << 40)
        ^ SEQ
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The server gives clients without a hello ids with the top bit set.
    x & !(1 << 63)
}

impl Connector for StoreConnector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(self.open()?))
    }

    fn fences(&self) -> bool {
        true
    }
}

/// An operation of the state API with CHC's tags (see [`StoreBackend::execute_tagged`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged {
    /// The operation.
    pub op: Op,
    /// The NF instance sending it (checked against the object's owner).
    pub instance: Option<u32>,
    /// The packet's logical clock (an update with the same instance, object and clock is
    /// applied once).
    pub clock: Option<u64>,
}

/// What [`StoreBackend::execute_tagged`] answers per operation: [`TaggedReply::Duplicate`]
/// when the store recognised the update as applied before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaggedReply {
    /// Applied (or read): the usual reply.
    Reply(Reply),
    /// Not applied: the same instance sent this update for this object and clock before.
    Duplicate,
}

/// What the store pushes to a subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// Another client changed the object; its value now (`None`: deleted).
    Updated {
        /// The object.
        key: String,
        /// Its value now.
        object: Option<Object>,
    },
    /// The object (or one map field) reached its time to live; this subscriber is the one
    /// told (StatelessNF §4.1).
    Expired {
        /// The object.
        key: String,
        /// The map field, if only a field expired.
        field: Option<Vec<u8>>,
    },
}

/// The TLS configuration trusting the certificates of `path`.
fn client_tls(path: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, SettingError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |why: String| SettingError::new("ca_file", format!("{}: {why}", path.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| bad(format!("not a CA certificate: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// How connections are made: plain, TLS, or (a `ca_file` that could not be read) not at all.
#[derive(Debug, Clone)]
enum TlsSetup {
    Plain,
    Tls(Arc<rustls::ClientConfig>),
    Broken(String),
}

/// A connection's byte stream: plain TCP or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn socket(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.socket().set_read_timeout(t)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}

struct Conn {
    stream: Stream,
    rbuf: Vec<u8>,
    /// Where reads land (allocated once per connection).
    chunk: Box<[u8]>,
    /// Bytes of `rbuf` already consumed.
    start: usize,
}

/// A frame sent and not yet answered: its bytes in `out`, to send again after a reconnect.
struct Sent {
    id: u64,
    range: std::ops::Range<usize>,
    answered: bool,
}

/// A non-blocking batch not yet acknowledged.
struct Unacked {
    id: u64,
    bytes: Vec<u8>,
    sent_at: Instant,
}

/// A connection to the store: the [`Backend`] plus the store's own operations.
pub struct StoreBackend {
    settings: Settings,
    tls: TlsSetup,
    client: u64,
    next_op: u64,
    next_req: u64,
    conn: Option<Conn>,
    /// Encoded frames of the current call (reused).
    out: Vec<u8>,
    sent: Vec<Sent>,
    /// Answers of the current call's batches, by frame.
    answers: Vec<Option<Vec<proto::Reply>>>,
    /// The answer of the current call's control request ([`StoreBackend::control`]).
    control_answer: Option<Message>,
    unacked: VecDeque<Unacked>,
    notes: VecDeque<Pushed>,
    limits: Limits,
}

impl std::fmt::Debug for StoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreBackend")
            .field("addr", &self.settings.addr)
            .field("client", &self.client)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

fn unreachable(reason: impl Into<String>) -> BackendError {
    BackendError::Unreachable {
        backend: NAME,
        reason: reason.into(),
    }
}

fn protocol(reason: impl Into<String>) -> BackendError {
    BackendError::Protocol {
        backend: NAME,
        reason: reason.into(),
    }
}

/// Why one attempt failed: the connection (retry) or the answer (give up).
enum Fail {
    Conn(String),
    Fatal(BackendError),
}

impl StoreBackend {
    /// This client's id (the scope of its op ids).
    pub fn client_id(&self) -> u64 {
        self.client
    }

    /// Connects (and says hello) if not connected, trying until `deadline`.
    fn ensure(&mut self, deadline: Instant) -> Result<(), BackendError> {
        let mut backoff = Duration::from_millis(5);
        loop {
            if self.conn.is_some() {
                return Ok(());
            }
            match self.dial() {
                Ok(c) => {
                    self.conn = Some(c);
                    // Non-blocking batches not yet acknowledged go again, same op ids.
                    if let Err(Fail::Fatal(e)) = self.resend_unacked(true) {
                        return Err(e);
                    }
                    if self.conn.is_some() {
                        return Ok(());
                    }
                }
                Err(Fail::Fatal(e)) => return Err(e),
                Err(Fail::Conn(why)) => {
                    if Instant::now() + backoff > deadline {
                        return Err(unreachable(format!("{}: {why}", self.settings.addr)));
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    fn dial(&mut self) -> Result<Conn, Fail> {
        let s = &self.settings;
        let addrs: Vec<_> = s
            .addr
            .to_socket_addrs()
            .map_err(|e| Fail::Conn(format!("cannot resolve: {e}")))?
            .collect();
        let mut last = String::from("no address");
        for a in addrs {
            match TcpStream::connect_timeout(&a, s.timeout) {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let _ = stream.set_read_timeout(Some(s.timeout));
                    let _ = stream.set_write_timeout(Some(s.timeout));
                    let stream = match &self.tls {
                        TlsSetup::Plain => Stream::Plain(stream),
                        TlsSetup::Tls(config) => {
                            Stream::Tls(Box::new(handshake(config, &s.addr, stream)?))
                        }
                        TlsSetup::Broken(why) => {
                            return Err(Fail::Fatal(protocol(format!("TLS: {why}"))))
                        }
                    };
                    let mut c = Conn {
                        stream,
                        rbuf: Vec::with_capacity(64 * 1024),
                        chunk: vec![0; 64 * 1024].into_boxed_slice(),
                        start: 0,
                    };
                    let mut hello = Vec::new();
                    let id = self.next_req;
                    self.next_req += 1;
                    proto::encode(
                        &Frame {
                            id,
                            msg: Message::Hello {
                                client: self.client,
                                token: s
                                    .token
                                    .as_ref()
                                    .map(|t| t.expose().as_bytes().to_vec())
                                    .unwrap_or_default(),
                            },
                        },
                        &mut hello,
                    );
                    c.stream
                        .write_all(&hello)
                        .map_err(|e| Fail::Conn(format!("write: {e}")))?;
                    let f = read_frame(&mut c, &self.limits)?;
                    return match f.msg {
                        Message::Welcome { .. } => Ok(c),
                        Message::Error { code, message } => Err(Fail::Fatal(protocol(format!(
                            "refused ({code:?}): {message}"
                        )))),
                        other => Err(Fail::Fatal(protocol(format!(
                            "unexpected answer to hello: {other:?}"
                        )))),
                    };
                }
                Err(e) => last = format!("connect {a}: {e}"),
            }
        }
        Err(Fail::Conn(last))
    }

    /// Encodes one batch frame of `ops` into `self.out`; its request id.
    fn encode_batch<'a>(
        &mut self,
        count: usize,
        ops: impl Iterator<Item = (&'a Op, Option<u32>, Option<u64>)>,
        ack_only: bool,
        fence: Option<&Fence>,
    ) -> u64 {
        let id = self.next_req;
        self.next_req += 1;
        let op_id = self.next_op;
        self.next_op += 1;
        let head = u32::from(fence.is_some());
        let start = proto::begin_batch(&mut self.out, id, op_id, ack_only, count as u32 + head);
        if let Some(f) = fence {
            let check = proto::Command::Fence {
                key: f.key.as_bytes(),
                value: f.value.as_slice(),
            };
            proto::put_request(&mut self.out, &check, None, None);
        }
        for (op, instance, clock) in ops.take(count) {
            proto::put_request(&mut self.out, op, instance, clock);
        }
        proto::finish(&mut self.out, start);
        id
    }

    /// Sends the frames in `self.out` (those of `self.sent` not answered) and reads until
    /// each is answered, reconnecting and sending again on a broken connection.
    fn round_trip(&mut self) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.settings.retry_for;
        let mut backoff = Duration::from_millis(5);
        loop {
            self.ensure(deadline)?;
            match self.attempt() {
                Ok(()) => return Ok(()),
                Err(Fail::Fatal(e)) => {
                    self.conn = None;
                    return Err(e);
                }
                Err(Fail::Conn(why)) => {
                    self.conn = None;
                    if Instant::now() + backoff > deadline {
                        return Err(unreachable(format!("{}: {why}", self.settings.addr)));
                    }
                    tracing::debug!("store {}: {why}; sending again", self.settings.addr);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    fn attempt(&mut self) -> Result<(), Fail> {
        let Some(c) = self.conn.as_mut() else {
            return Err(Fail::Conn("not connected".into()));
        };
        // One write for every frame still unanswered.
        if self.sent.iter().all(|s| !s.answered) {
            c.stream
                .write_all(&self.out)
                .map_err(|e| Fail::Conn(format!("write: {e}")))?;
        } else {
            for s in self.sent.iter().filter(|s| !s.answered) {
                c.stream
                    .write_all(&self.out[s.range.clone()])
                    .map_err(|e| Fail::Conn(format!("write: {e}")))?;
            }
        }
        let mut left = self.sent.iter().filter(|s| !s.answered).count();
        while left > 0 {
            let Some(c) = self.conn.as_mut() else {
                return Err(Fail::Conn("not connected".into()));
            };
            let f = read_frame(c, &self.limits)?;
            if let Some(i) = self.sent.iter().position(|s| s.id == f.id && !s.answered) {
                match f.msg {
                    Message::Replies(r) => {
                        self.sent[i].answered = true;
                        self.answers[i] = Some(r);
                        left -= 1;
                    }
                    msg @ (Message::Keys(_) | Message::StatsReply(_)) => {
                        self.sent[i].answered = true;
                        self.control_answer = Some(msg);
                        left -= 1;
                    }
                    Message::Error {
                        code: ErrorCode::TimedOut,
                        message,
                    } => return Err(Fail::Conn(message)),
                    Message::Error { code, message } => {
                        return Err(Fail::Fatal(protocol(format!(
                            "the store refused a request ({code:?}): {message}"
                        ))))
                    }
                    other => {
                        return Err(Fail::Fatal(protocol(format!(
                            "unexpected answer: {other:?}"
                        ))))
                    }
                }
            } else {
                self.other_frame(f)?;
            }
        }
        Ok(())
    }

    /// A frame that answers no request of the current call: an ack or a push.
    fn other_frame(&mut self, f: Frame) -> Result<(), Fail> {
        match f.msg {
            Message::Ack { .. } => {
                self.unacked.retain(|u| u.id != f.id);
                Ok(())
            }
            Message::Notify(n) => {
                self.notes.push_back(match n {
                    Notification::Updated { key, object } => Pushed::Updated {
                        key: String::from_utf8_lossy(&key).into_owned(),
                        object,
                    },
                    Notification::Expired { key, field } => Pushed::Expired {
                        key: String::from_utf8_lossy(&key).into_owned(),
                        field,
                    },
                });
                Ok(())
            }
            // The store closed a connection it found idle: connect again.
            Message::Error {
                code: ErrorCode::TimedOut,
                message,
            } => Err(Fail::Conn(message)),
            Message::Error { code, message } => Err(Fail::Fatal(protocol(format!(
                "the store sent an error ({code:?}): {message}"
            )))),
            // An answer to a request of an earlier, failed call: nobody waits for it.
            _ => Ok(()),
        }
    }

    /// Runs the frames prepared in `self.out` and `self.sent`; fills `self.answers`.
    fn run_prepared(&mut self) -> Result<(), BackendError> {
        self.answers.clear();
        self.answers.resize(self.sent.len(), None);
        self.control_answer = None;
        let r = self.round_trip();
        self.out.clear();
        if self.out.capacity() > 16 << 20 {
            self.out.shrink_to(64 * 1024);
        }
        r
    }

    /// Frames of at most `max_batch` operations, each headed by `fence` if there is one.
    fn prepare<'a, I>(&mut self, n: usize, mut ops: I, fence: Option<&Fence>)
    where
        I: Iterator<Item = (&'a Op, Option<u32>, Option<u64>)>,
    {
        self.out.clear();
        self.sent.clear();
        let head = usize::from(fence.is_some());
        let max = self.settings.max_batch.max(1 + head) - head;
        let mut first = 0;
        while first < n {
            let k = (n - first).min(max);
            let start = self.out.len();
            let id = self.encode_batch(k, ops.by_ref(), false, fence);
            self.sent.push(Sent {
                id,
                range: start..self.out.len(),
                answered: false,
            });
            first += k;
        }
    }

    /// Runs `ops` in frames (each headed by `fence`, if any) and appends their replies; a
    /// frame whose fence did not hold fails the call ([`BackendError::Fenced`]).
    fn run_batches(
        &mut self,
        ops: &[Op],
        replies: &mut Vec<Reply>,
        fence: Option<&Fence>,
    ) -> Result<(), BackendError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.prepare(ops.len(), ops.iter().map(|o| (o, None, None)), fence);
        self.run_prepared()?;
        replies.reserve(ops.len());
        let before = replies.len();
        for a in self.answers.drain(..) {
            let mut a = a
                .ok_or_else(|| protocol("a batch was not answered"))?
                .into_iter();
            if let Some(f) = fence {
                if refused_by_fence(a.next().as_ref()) {
                    replies.truncate(before);
                    return Err(BackendError::Fenced {
                        backend: NAME,
                        key: f.key.to_string(),
                    });
                }
            }
            replies.extend(a.map(reply_from));
        }
        if replies.len() - before != ops.len() {
            replies.truncate(before);
            return Err(protocol(
                "the store answered a different number of operations",
            ));
        }
        Ok(())
    }

    /// Runs operations with CHC tags (CHC §5.1, §5.3): one reply per operation.
    pub fn execute_tagged(&mut self, ops: &[Tagged]) -> Result<Vec<TaggedReply>, BackendError> {
        self.prepare(
            ops.len(),
            ops.iter().map(|t| (&t.op, t.instance, t.clock)),
            None,
        );
        self.run_prepared()?;
        let mut out = Vec::with_capacity(ops.len());
        for a in self.answers.drain(..) {
            let a = a.ok_or_else(|| protocol("a batch was not answered"))?;
            for r in a {
                out.push(match r {
                    proto::Reply::Error(Failure::Duplicate) => TaggedReply::Duplicate,
                    r => TaggedReply::Reply(reply_from(r)),
                });
            }
        }
        if out.len() != ops.len() {
            return Err(protocol(format!(
                "{} replies to {} operations",
                out.len(),
                ops.len()
            )));
        }
        Ok(out)
    }

    /// Makes `instance` the owner of the object (created empty if missing): only operations
    /// tagged with that instance may change it from now on (CHC §5.1). Whether it was granted.
    pub fn claim(
        &mut self,
        key: &ObjectKey,
        kind: Kind,
        instance: u32,
    ) -> Result<bool, BackendError> {
        self.special(Command::Claim {
            key: key.as_bytes().to_vec(),
            kind,
            instance,
        })
    }

    /// Hands ownership of the object from `from` to `to` (a flow move, CHC §5.1); whether
    /// `from` owned it.
    pub fn handover(&mut self, key: &ObjectKey, from: u32, to: u32) -> Result<bool, BackendError> {
        self.special(Command::Handover {
            key: key.as_bytes().to_vec(),
            from,
            to,
        })
    }

    fn special(&mut self, op: Command) -> Result<bool, BackendError> {
        self.out.clear();
        self.sent.clear();
        let id = self.next_req;
        self.next_req += 1;
        let op_id = self.next_op;
        self.next_op += 1;
        let start = proto::begin_batch(&mut self.out, id, op_id, false, 1);
        proto::put_request(&mut self.out, &op, None, None);
        proto::finish(&mut self.out, start);
        self.sent.push(Sent {
            id,
            range: 0..self.out.len(),
            answered: false,
        });
        self.run_prepared()?;
        match self.answers.pop().flatten().and_then(|mut v| v.pop()) {
            Some(proto::Reply::Bool(b)) => Ok(b),
            Some(r) => match reply_from(r) {
                Reply::Error(e) => Err(protocol(e.to_string())),
                r => Err(protocol(format!("unexpected reply {r:?}"))),
            },
            None => Err(protocol("no reply")),
        }
    }

    /// Sends `ops` as a non-blocking batch (CHC §4.3): returns once written; the store applies
    /// it in order and acknowledges it. Unacknowledged batches are sent again (same op id, so
    /// never applied twice) after [`Settings::retransmit_after`] or a reconnect, from
    /// [`StoreBackend::poll`] and every other call.
    pub fn send_nowait(&mut self, ops: &[Tagged]) -> Result<(), BackendError> {
        self.out.clear();
        let id = self.encode_batch(
            ops.len(),
            ops.iter().map(|t| (&t.op, t.instance, t.clock)),
            true,
            None,
        );
        // Kept until acknowledged; `out` keeps its capacity for the next call.
        let bytes = self.out.split_off(0);
        self.unacked.push_back(Unacked {
            id,
            bytes,
            sent_at: Instant::now(),
        });
        let deadline = Instant::now() + self.settings.retry_for;
        self.ensure(deadline)?;
        let last = self.unacked.len() - 1;
        let c = self
            .conn
            .as_mut()
            .ok_or_else(|| unreachable("not connected"))?;
        if c.stream.write_all(&self.unacked[last].bytes).is_err() {
            // Sent again on the reconnect.
            self.conn = None;
        }
        Ok(())
    }

    /// Non-blocking batches sent and not yet acknowledged.
    pub fn unacked(&self) -> usize {
        self.unacked.len()
    }

    fn resend_unacked(&mut self, all: bool) -> Result<(), Fail> {
        let after = self.settings.retransmit_after;
        let Some(c) = self.conn.as_mut() else {
            return Ok(());
        };
        for u in self.unacked.iter_mut() {
            if all || u.sent_at.elapsed() >= after {
                if let Err(e) = c.stream.write_all(&u.bytes) {
                    self.conn = None;
                    return Err(Fail::Conn(format!("write: {e}")));
                }
                u.sent_at = Instant::now();
            }
        }
        Ok(())
    }

    /// Reads what the store has pushed or acknowledged, waiting up to `wait` for something;
    /// sends overdue non-blocking batches again. Returns the pushes received so far.
    pub fn poll(&mut self, wait: Duration) -> Result<Vec<Pushed>, BackendError> {
        let deadline = Instant::now() + wait;
        loop {
            if self.conn.is_none() {
                self.ensure(Instant::now() + self.settings.retry_for)?;
            }
            if let Err(Fail::Fatal(e)) = self.resend_unacked(false) {
                return Err(e);
            }
            let now = Instant::now();
            if !self.notes.is_empty() || now >= deadline {
                // Drain whatever is already buffered without waiting.
                self.read_some(Duration::from_millis(1))?;
                return Ok(self.notes.drain(..).collect());
            }
            let step = (deadline - now).min(self.settings.retransmit_after);
            self.read_some(step)?;
            if self.unacked.is_empty() && !self.notes.is_empty() {
                return Ok(self.notes.drain(..).collect());
            }
        }
    }

    /// Reads frames for up to `wait`.
    fn read_some(&mut self, wait: Duration) -> Result<(), BackendError> {
        let Some(c) = self.conn.as_mut() else {
            return Ok(());
        };
        let _ = c
            .stream
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))));
        let r = read_frame(c, &self.limits);
        if let Some(c) = self.conn.as_mut() {
            let _ = c.stream.set_read_timeout(Some(self.settings.timeout));
        }
        match r {
            Ok(f) => {
                if let Err(Fail::Fatal(e)) = self.other_frame(f) {
                    return Err(e);
                }
                // More may be buffered already.
                while let Some(c) = self.conn.as_mut() {
                    match take_buffered(c, &self.limits) {
                        Ok(Some(f)) => {
                            if let Err(Fail::Fatal(e)) = self.other_frame(f) {
                                return Err(e);
                            }
                        }
                        Ok(None) => break,
                        Err(Fail::Fatal(e)) => return Err(e),
                        Err(Fail::Conn(_)) => {
                            self.conn = None;
                            break;
                        }
                    }
                }
                Ok(())
            }
            Err(Fail::Conn(why)) if why.starts_with("timeout") => Ok(()),
            Err(Fail::Conn(_)) => {
                self.conn = None;
                Ok(())
            }
            Err(Fail::Fatal(e)) => Err(e),
        }
    }

    /// Subscribes to an object: the store pushes its new value whenever another connection
    /// changes it, and may tell this connection (as `instance`) of its expiry.
    pub fn subscribe(&mut self, key: &ObjectKey, instance: u32) -> Result<(), BackendError> {
        self.control(Message::Subscribe {
            key: key.as_bytes().to_vec(),
            instance,
        })
        .map(drop)
    }

    /// Ends a subscription.
    pub fn unsubscribe(&mut self, key: &ObjectKey) -> Result<(), BackendError> {
        self.control(Message::Unsubscribe {
            key: key.as_bytes().to_vec(),
        })
        .map(drop)
    }

    /// The store's statistics (`ops_per_sec`, `connections`, `objects`, `memory_bytes`,
    /// `wal_lag_bytes`, ...).
    pub fn stats(&mut self) -> Result<Vec<(String, u64)>, BackendError> {
        match self.control(Message::Stats)? {
            Message::StatsReply(v) => Ok(v),
            other => Err(protocol(format!("unexpected answer to Stats: {other:?}"))),
        }
    }

    /// Sends one request that is not a batch and waits for its answer.
    fn control(&mut self, msg: Message) -> Result<Message, BackendError> {
        self.out.clear();
        self.sent.clear();
        let id = self.next_req;
        self.next_req += 1;
        proto::encode(&Frame { id, msg }, &mut self.out);
        self.sent.push(Sent {
            id,
            range: 0..self.out.len(),
            answered: false,
        });
        self.run_prepared()?;
        match self.answers.pop().flatten() {
            Some(replies) => Ok(Message::Replies(replies)),
            None => self
                .control_answer
                .take()
                .ok_or_else(|| protocol("no answer")),
        }
    }
}

/// A TLS session with the store at `addr` over `sock`, its handshake done: the store's
/// certificate checked against the CA and the host of `addr`. A refused certificate is fatal
/// (no retry); a connection lost meanwhile is retried.
fn handshake(
    config: &Arc<rustls::ClientConfig>,
    addr: &str,
    mut sock: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, Fail> {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
        Fail::Fatal(protocol(format!(
            "TLS: {host:?} is not a host name or address: {e}"
        )))
    })?;
    let mut tls = rustls::ClientConnection::new(config.clone(), name)
        .map_err(|e| Fail::Fatal(protocol(format!("TLS: {e}"))))?;
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut sock) {
            let rustls_error = e
                .get_ref()
                .and_then(|i| i.downcast_ref::<rustls::Error>())
                .cloned();
            return Err(match rustls_error {
                Some(rustls::Error::InvalidCertificate(why)) => Fail::Fatal(protocol(format!(
                    "TLS: the store's certificate is not trusted ({why:?}): ca_file must hold \
                     the CA that signed it"
                ))),
                Some(
                    rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. },
                ) => Fail::Fatal(protocol(format!(
                    "TLS handshake failed ({e}): does the store serve TLS \
                         (flowstate store --tls-cert)?"
                ))),
                Some(other) => Fail::Fatal(protocol(format!("TLS handshake failed: {other}"))),
                None => Fail::Conn(format!("TLS handshake: {e}")),
            });
        }
    }
    Ok(rustls::StreamOwned::new(tls, sock))
}

/// Reads one whole frame, waiting for it.
fn read_frame(c: &mut Conn, limits: &Limits) -> Result<Frame, Fail> {
    loop {
        if let Some(f) = take_buffered(c, limits)? {
            return Ok(f);
        }
        if c.start > 0 {
            c.rbuf.drain(..c.start);
            c.start = 0;
        }
        match c.stream.read(&mut c.chunk[..]) {
            Ok(0) => {
                return Err(Fail::Conn("the store closed the connection".into()));
            }
            Ok(n) => c.rbuf.extend_from_slice(&c.chunk[..n]),
            Err(e) => {
                let timeout = matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
                return Err(Fail::Conn(if timeout {
                    format!("timeout: {e}")
                } else {
                    format!("read: {e}")
                }));
            }
        }
    }
}

/// A whole frame already in the buffer, if any.
fn take_buffered(c: &mut Conn, limits: &Limits) -> Result<Option<Frame>, Fail> {
    match proto::decode(&c.rbuf[c.start..], limits) {
        Ok(Some((f, used))) => {
            c.start += used;
            if c.start == c.rbuf.len() {
                c.rbuf.clear();
                c.start = 0;
            }
            Ok(Some(f))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(Fail::Fatal(protocol(format!("undecodable frame: {e}")))),
    }
}

impl Backend for StoreBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Each frame begins with the fence ([`proto::Command::Fence`]), which the store checks
    /// atomically with the frame's operations on the fence's partition (a batch longer than
    /// a frame is fenced frame by frame).
    fn execute_fenced(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        self.run_batches(ops, replies, Some(fence))
    }

    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        self.run_batches(ops, replies, None)
    }

    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        let a = self.control(Message::Partitions {
            nf: nf.as_bytes().to_vec(),
            kind,
            id: id.as_bytes().to_vec(),
        })?;
        let Message::Keys(a) = a else {
            return Err(protocol(format!("unexpected answer to Partitions: {a:?}")));
        };
        let mut keys: Vec<ObjectKey> = a
            .into_iter()
            .filter_map(|k| std::str::from_utf8(&k).ok().and_then(ObjectKey::from_raw))
            .collect();
        keys.sort();
        Ok(keys)
    }
}

/// Whether a fenced frame's first answer (its fence's) says the fence did not hold. A frame
/// sent again after the store restarted, whose first sending the store had logged before it
/// died, is answered `Duplicate` throughout: that says nothing of its fence (the original
/// ran whole, or stopped at its fence), so it is not taken for a refusal: its operations
/// answer "already applied", and the caller's next fenced batch finds out whether the fence
/// holds.
fn refused_by_fence(first: Option<&proto::Reply>) -> bool {
    !matches!(
        first,
        Some(proto::Reply::Bool(true) | proto::Reply::Error(Failure::Duplicate))
    )
}

/// The state API's reply for the store's: its failures worded as the state API's.
fn reply_from(r: proto::Reply) -> Reply {
    r.map_err(|failure| match failure {
        Failure::WrongKind { key, wanted, found } => OpError::WrongKind {
            key: String::from_utf8_lossy(&key).into_owned(),
            wanted: wanted.name(),
            found: found.name(),
        },
        Failure::Refused(m) => OpError::Refused(m),
        Failure::Duplicate => OpError::Refused(
            "already applied: the store recognised this update as a duplicate".into(),
        ),
    })
}

/// The protocol operation a state-API operation stands for: its key as bytes. The driver
/// writes the state-API operation itself ([`proto::put_request`]), which encodes as this one.
pub fn to_proto(op: &Op) -> proto::Op {
    op.map(|key| key.as_bytes().to_vec(), Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::Owner;

    #[test]
    fn only_a_fence_that_answers_no_refuses_a_frame() {
        assert!(!refused_by_fence(Some(&proto::Reply::Bool(true))));
        assert!(!refused_by_fence(Some(&proto::Reply::Error(
            Failure::Duplicate
        ))));
        assert!(refused_by_fence(Some(&proto::Reply::Bool(false))));
        assert!(refused_by_fence(Some(&proto::Reply::Error(
            Failure::Refused("x".into())
        ))));
        assert!(refused_by_fence(None));
    }

    fn all_ops() -> Vec<Op> {
        let key = ObjectKey::partitioned(&Owner::new("nf", 1, 2), Kind::Map, "x");
        let b = |s: &str| s.as_bytes().to_vec();
        vec![
            Op::Get { key: key.clone() },
            Op::Set {
                key: key.clone(),
                value: b("v"),
            },
            Op::Delete { key: key.clone() },
            Op::Add {
                key: key.clone(),
                delta: -3,
            },
            Op::GetCounter { key: key.clone() },
            Op::SetCounter {
                key: key.clone(),
                value: 9,
            },
            Op::Push {
                key: key.clone(),
                item: b("i"),
            },
            Op::Pop { key: key.clone() },
            Op::Insert {
                key: key.clone(),
                member: b("m"),
            },
            Op::Remove {
                key: key.clone(),
                member: b("m"),
            },
            Op::Contains {
                key: key.clone(),
                member: b("m"),
            },
            Op::MapGet {
                key: key.clone(),
                field: b("f"),
            },
            Op::MapSet {
                key: key.clone(),
                field: b("f"),
                value: b("v"),
            },
            Op::MapDelete {
                key: key.clone(),
                field: b("f"),
            },
            Op::MapAdd {
                key: key.clone(),
                field: b("f"),
                delta: 2,
            },
            Op::MapGetCounter {
                key: key.clone(),
                field: b("f"),
            },
            Op::CompareAndSet {
                key: key.clone(),
                expected: None,
                new: Some(b("n")),
            },
            Op::Expire {
                key: key.clone(),
                field: Some(b("f")),
                ttl: Duration::from_millis(7),
            },
            Op::Len {
                key: key.clone(),
                kind: Kind::Set,
            },
            Op::ReadAll {
                key: key.clone(),
                kind: Kind::CounterMap,
            },
            Op::Lock {
                key: key.clone(),
                owner: 4,
                lease: Duration::from_secs(1),
            },
            Op::Unlock { key, owner: 4 },
        ]
    }

    #[test]
    fn direct_encoding_is_the_protocol_encoding() {
        for op in all_ops() {
            for (i, c) in [(None, None), (Some(3), Some(99))] {
                let mut a = Vec::new();
                proto::put_request(&mut a, &op, i, c);
                let mut b = Vec::new();
                proto::put_request(&mut b, &to_proto(&op), i, c);
                assert_eq!(a, b, "{op:?}");
                let back = proto::Rd::new(&a).request().unwrap();
                assert_eq!(back.op, to_proto(&op));
            }
        }
    }

    #[test]
    fn settings_name_the_bad_key() {
        let c = StoreConnector::from_config(Some("store://10.0.0.1:9000"), [("token", "s3cret")])
            .unwrap();
        assert_eq!(c.settings().addr, "10.0.0.1:9000");
        assert_eq!(c.settings().token, Some(Secret::new("s3cret")));
        let shown = format!("{:?}", c.settings());
        assert!(
            !shown.contains("s3cret") && shown.contains("***"),
            "{shown}"
        );
        let e = StoreConnector::from_config(Some("nowhere"), []).unwrap_err();
        assert_eq!(e.key, "url");
        let e = StoreConnector::from_config(None, [("colour", "red")]).unwrap_err();
        assert_eq!(e.key, "colour");
        let e = StoreConnector::from_config(None, [("retry", "soon")]).unwrap_err();
        assert_eq!(e.key, "retry");
        assert_eq!(
            StoreConnector::from_config(None, [("retry", "250ms")])
                .unwrap()
                .settings()
                .retry_for,
            Duration::from_millis(250)
        );
        assert_eq!(
            StoreConnector::from_config(None, [("timeout", "1m30s")])
                .unwrap()
                .settings()
                .timeout,
            Duration::from_secs(90)
        );
        // A bare number meant milliseconds: the message says so.
        let e = StoreConnector::from_config(None, [("timeout", "500")]).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.as_str()),
            ("timeout", "write a duration with its unit, e.g. \"500ms\"")
        );
    }

    #[test]
    fn unreachable_store_is_an_error_not_a_hang() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let c = StoreConnector::with_settings(Settings {
            addr: addr.to_string(),
            timeout: Duration::from_millis(200),
            ..Settings::default()
        });
        assert!(matches!(c.open(), Err(BackendError::Unreachable { .. })));
    }
}
