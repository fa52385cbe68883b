//! flowstate's telemetry: Prometheus metrics, a small JSON API and a dashboard page, served
//! over HTTP on one listener by every long-running process (a live box, `flowstate store`).
//!
//! ```text
//!  role (data path: plain per-worker counters, no lock)
//!    | publishes snapshots (atomics, or a slot a worker swaps every 100 ms)
//!    v
//!  Provider (the binary wires it) --Metrics / JSON--> Server (std threads) <-- GET /metrics, curl
//! ```
//!
//! This crate depends on nothing of flowstate's: a role hands it plain snapshots through a
//! [`Provider`] that the binary writes, so the data path never waits for an exporter.
//!
//! Endpoints:
//! * `GET /metrics`: the OpenMetrics text exposition
//!   (`application/openmetrics-text; version=1.0.0`), every name prefixed `flowstate_`,
//!   counters ending in `_total` ([`Metrics`]).
//! * `GET /api/v1/NAME`: a JSON document the provider answers ([`Provider::api`]); a live box
//!   answers `summary` (its run summary so far), `tables` and `tables/NF/TABLE` (paged,
//!   [`Provider::api_page`]), the store `stats`.
//! * `GET /api/v1/NAME` of a live stream ([`Provider::stream`]; a live box's `events`): JSON
//!   lines (`application/x-ndjson`) as they happen, until either side goes; at most
//!   [`MAX_STREAMS`] (16) at once.
//! * `POST /api/v1/NAME`: an action ([`Provider::post`]); a live box's `reload` re-reads its
//!   configuration file (`422` with the reasons when it is refused).
//! * `GET /api/v1/info`: what the process is and which document holds its numbers
//!   (`{"role":"chain","document":"summary"}`, from [`Provider::info`]), so a client knows what
//!   to poll.
//! * `GET /`: the dashboard, one self-contained HTML page ([`DASHBOARD`]) that polls the
//!   document every second and draws live charts.
//! * `GET /endpoints`: the list of endpoints, as plain text.
//! * `GET /healthz`: `ok`.
//!
//! Promises:
//! * The listener is loopback unless an address is given explicitly
//!   ([`parse_listen`], [`DEFAULT_LISTEN`]); one beyond loopback without a token is warned
//!   about at start.
//! * The accepting thread never reads from a peer: each connection is read and answered on a
//!   thread of its own, so a slow or silent peer delays nobody. At most
//!   [`MAX_OPEN_CONNECTIONS`] (256, [`Options::max_open`]) connections are open at once and
//!   more are answered `503`; a peer has [`READ_TIMEOUT`] (5 s, [`Options::read_timeout`]) to
//!   send its request head, so a silent one holds one of those places that long at most.
//! * Nothing a peer sends makes the server panic: request heads are bounded
//!   ([`http::MAX_HEAD`], 8 KiB), writes have a timeout ([`WRITE_TIMEOUT`], 5 s), a request
//!   line that is not `GET|HEAD /path HTTP/1.x` gets a 4xx/5xx status, at most
//!   [`MAX_CONNECTIONS`] (8, [`Options::max_answering`]) requests are answered at once (more
//!   get `503`), and a provider that panics gives a `500`.
//! * A document of rows (a table) is answered a page at a time ([`page`]):
//!   `?limit=N&after=CURSOR`, at most [`page::DEFAULT_ROWS`] (1000) rows without `limit`, never
//!   more than [`page::MAX_ROWS`] (10,000); the answer's `next` is the cursor of the next page
//!   (`null` after the last). A bad `limit` or `after` gets a `400` naming it.
//! * With a token ([`Options::token`], [`Token`]), every endpoint but `/healthz` answers only a
//!   request with `Authorization: Bearer TOKEN` (compared in constant time); others get `401`
//!   with `WWW-Authenticate: Bearer`.
//! * How connections ended is counted on `/metrics`:
//!   `flowstate_telemetry_connections_total{result="answered|refused|unauthorized|timed_out|closed"}`,
//!   and `flowstate_telemetry_open_connections`.
//! * Every answer closes its connection (`Connection: close`): a scrape is one request.
//!
//! ```
//! use flowstate_telemetry::{Metrics, Provider, Server};
//! use std::io::{Read, Write};
//! use std::sync::Arc;
//!
//! struct Counts;
//! impl Provider for Counts {
//!     fn metrics(&self, m: &mut Metrics) {
//!         m.counter("packets", "Packets seen.", &[("port", "inside")], 42);
//!     }
//!     fn api(&self, name: &str) -> Option<String> {
//!         (name == "summary").then(|| r#"{"packets":42}"#.to_owned())
//!     }
//! }
//!
//! let server = Server::start("127.0.0.1:0".parse()?, Arc::new(Counts))?;
//! let mut c = std::net::TcpStream::connect(server.local_addr())?;
//! c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
//! let mut page = String::new();
//! c.read_to_string(&mut page)?;
//! assert!(page.contains("flowstate_packets_total{port=\"inside\"} 42"));
//! server.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod client;
pub mod http;
pub mod metrics;
pub mod page;
pub mod token;

pub use metrics::{Histogram, Metrics};
pub use page::Page;
pub use token::Token;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The listener's default address: loopback, Prometheus' usual exporter port range.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9464);

/// Requests answered at once (the provider asked); more are answered `503` and closed.
pub const MAX_CONNECTIONS: usize = 8;

/// Live streams ([`Provider::stream`]) served at once; more are answered `503`.
pub const MAX_STREAMS: usize = 16;

/// Connections open at once (each read on a thread of its own); more are answered `503` and
/// closed.
pub const MAX_OPEN_CONNECTIONS: usize = 256;

/// How long a peer has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long writing an answer may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The content type of `/metrics`.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The dashboard served at `/`: one HTML page with its CSS and JavaScript inline and no
/// external asset (it works offline). It reads `api/v1/info`, then polls the document named
/// there every second and draws, as inline SVG, what it finds in it:
/// * a run's summary (an object with an `nfs` array): packets in, out and dropped per second,
///   each NF's packets in, forwarded and dropped (by reason) per second, each NF's `report`
///   entries (any name → number) as they are, the workers' state flushes, flush errors and
///   busy share, and a live box's port counters (`live_box.*_packets`);
/// * the store's statistics (an object with an `ops` object): operations per second by type,
///   and its gauges;
/// * any document: a table of its numbers (top-level, and one level into objects).
///
/// Rates are a counter's change between two readings divided by the time between them on the
/// process's own clock (`wall_s`, or `uptime_s`, when the document has one); a counter that
/// goes back (the process restarted) leaves a gap. When a poll fails the page says
/// "disconnected, retrying" and keeps polling.
pub const DASHBOARD: &str = include_str!("dashboard.html");

/// The plain-text list of endpoints (`/endpoints`).
fn endpoints(info: &Info) -> String {
    format!(
        "flowstate telemetry ({role})\n  /                   dashboard (HTML)\n  /metrics            Prometheus/OpenMetrics exposition\n  /api/v1/{doc:<11} this process's numbers as JSON\n  /api/v1/info        what this process is, as JSON\n  /healthz            liveness\n  /endpoints          this list\n",
        role = info.role,
        doc = info.document,
    )
}

/// What a process is, as `/api/v1/info` tells a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// What the process is: `chain` (a run of the chain, a live box), `store`, ...
    pub role: String,
    /// The `/api/v1/NAME` document that holds its numbers (`summary`, `stats`): lowercase
    /// letters, digits and `_`.
    pub document: String,
}

impl Info {
    /// The JSON object `/api/v1/info` answers.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"role\":{},\"document\":{}}}",
            json_string(&self.role),
            json_string(&self.document)
        )
    }
}

impl Default for Info {
    /// A process of no particular role whose numbers are in `summary`.
    fn default() -> Self {
        Info {
            role: "process".into(),
            document: "summary".into(),
        }
    }
}

/// `s` as a JSON string literal (RFC 8259 §7).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What a role exposes. Called from the server's threads, once per request: it reads the
/// role's published counters and must not wait for its data path.
pub trait Provider: Send + Sync + 'static {
    /// Adds this scrape's metrics to `m`.
    fn metrics(&self, m: &mut Metrics);

    /// The JSON document `/api/v1/NAME` answers (`None`: 404). `/api/v1/info` is the
    /// server's own ([`Provider::info`]): `api` is not asked for it.
    fn api(&self, name: &str) -> Option<String>;

    /// [`Provider::api`] for a request that may ask for a page of a long document
    /// (`?limit=N&after=CURSOR`, read into `page`): a document of rows answers at most
    /// `page.limit` of them and the cursor of the next page ([`page::Page::select`]). Other
    /// documents ignore `page`, as this default does.
    fn api_page(&self, name: &str, page: &Page) -> Option<String> {
        let _ = page;
        self.api(name)
    }

    /// What the process is and which [`Provider::api`] document holds its numbers.
    fn info(&self) -> Info {
        Info::default()
    }

    /// The live stream `/api/v1/NAME?QUERY` answers (`None`: no such stream; `Err`: a bad
    /// query, answered `400` with the reason): JSON objects, one per line, as the receiver
    /// gets them. The stream ends when the sender goes or the peer does.
    fn stream(&self, name: &str, query: Option<&str>) -> Option<Result<Receiver<String>, String>> {
        let _ = (name, query);
        None
    }

    /// The action `POST /api/v1/NAME` asks for (`None`: no such action, `405`): its JSON
    /// answer, or the JSON of why it was refused (`422`). A live box's `reload`.
    fn post(&self, name: &str) -> Option<Result<String, String>> {
        let _ = name;
        None
    }
}

/// An address for the listener: `HOST:PORT` as given (an explicit non-loopback address is
/// allowed), or just `PORT` (`9464`, `:9464`), which means loopback.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    let port = t.strip_prefix(':').unwrap_or(t);
    let port = port.strip_prefix("localhost:").unwrap_or(port);
    match port.parse::<u16>() {
        Ok(p) => Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), p)),
        Err(_) => Err(format!(
            "expected an address and port (127.0.0.1:9464) or a port (9464), got {s:?}"
        )),
    }
}

/// How a [`Server`] bounds its work and who it answers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Connections open at once, each on a thread of its own while it is read and answered;
    /// more are answered `503` and closed ([`MAX_OPEN_CONNECTIONS`]).
    pub max_open: usize,
    /// Requests answered at once (the provider asked); more are answered `503`
    /// ([`MAX_CONNECTIONS`]).
    pub max_answering: usize,
    /// How long a peer has to send its request head ([`READ_TIMEOUT`]); a silent peer holds
    /// one connection slot that long at most.
    pub read_timeout: Duration,
    /// How long writing an answer may take ([`WRITE_TIMEOUT`]).
    pub write_timeout: Duration,
    /// When set, every endpoint but `/healthz` wants `Authorization: Bearer TOKEN`.
    pub token: Option<Token>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_open: MAX_OPEN_CONNECTIONS,
            max_answering: MAX_CONNECTIONS,
            read_timeout: READ_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
            token: None,
        }
    }
}

/// A running HTTP listener. Stops when [`Server::stop`] is called or it is dropped.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Binds `addr` (port 0 picks a free port) and serves `provider` on a thread of its own,
    /// with the default [`Options`] (no token).
    pub fn start(addr: SocketAddr, provider: Arc<dyn Provider>) -> std::io::Result<Server> {
        Server::start_with(addr, provider, Options::default())
    }

    /// [`Server::start`] with `options`.
    pub fn start_with(
        addr: SocketAddr,
        provider: Arc<dyn Provider>,
        options: Options,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            if options.token.is_none() {
                tracing::warn!(
                    %addr,
                    "the telemetry listener is reachable from other hosts and answers anyone \
                     (its tables hold inside addresses): set [telemetry] token_file"
                );
            } else {
                tracing::warn!(
                    %addr,
                    "the telemetry listener is reachable from other hosts; its token travels \
                     in clear text (plain HTTP)"
                );
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let shared = Arc::new(Shared {
            provider,
            options,
            open: AtomicUsize::new(0),
            answering: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            ended: Default::default(),
        });
        let thread = std::thread::Builder::new()
            .name("flowstate-telemetry".into())
            .spawn(move || accept_loop(listener, shared, flag))?;
        tracing::info!(%addr, "telemetry: / (dashboard), /metrics, /api/v1/..., /healthz");
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accepting thread (connections already accepted end
    /// on their own threads).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

/// How a connection ended, counted in `flowstate_telemetry_connections_total{result}`.
#[derive(Debug, Clone, Copy)]
enum Ended {
    /// Answered (any status but those below).
    Answered,
    /// `503`: too many connections open or requests being answered.
    Refused,
    /// `401`: no token, or a wrong one.
    Unauthorized,
    /// No complete request head within the read timeout: closed without an answer.
    TimedOut,
    /// The peer closed, or the connection failed, before its request head was complete.
    Closed,
}

impl Ended {
    const ALL: [(Ended, &'static str); 5] = [
        (Ended::Answered, "answered"),
        (Ended::Refused, "refused"),
        (Ended::Unauthorized, "unauthorized"),
        (Ended::TimedOut, "timed_out"),
        (Ended::Closed, "closed"),
    ];
}

/// What the accepting thread and the connections' threads share.
struct Shared {
    provider: Arc<dyn Provider>,
    options: Options,
    /// Connections accepted and not yet closed.
    open: AtomicUsize,
    /// Requests whose answer is being made.
    answering: AtomicUsize,
    /// Streams being served.
    streams: AtomicUsize,
    /// Connections ended, by [`Ended`].
    ended: [AtomicU64; 5],
}

impl Shared {
    fn count(&self, e: Ended) {
        self.ended[e as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The listener's own metrics.
    fn metrics(&self, m: &mut Metrics) {
        for (e, name) in Ended::ALL {
            m.counter(
                "telemetry_connections",
                "Connections to the telemetry listener, by how they ended.",
                &[("result", name)],
                self.ended[e as usize].load(Ordering::Relaxed),
            );
        }
        let open = self.open.load(Ordering::Relaxed);
        m.gauge(
            "telemetry_open_connections",
            "Connections to the telemetry listener open now (this one included).",
            &[],
            i64::try_from(open).unwrap_or(i64::MAX),
        );
    }
}

/// One of a bounded number of places, given back when dropped.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    fn take(count: &'a AtomicUsize, max: usize) -> Option<Slot<'a>> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then(|| n + 1)
            })
            .ok()
            .map(|_| Slot(count))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's place among [`Options::max_open`], given back when dropped.
struct Open(Arc<Shared>);

impl Open {
    fn take(shared: &Arc<Shared>) -> Option<Open> {
        let slot = Slot::take(&shared.open, shared.options.max_open)?;
        std::mem::forget(slot);
        Some(Open(Arc::clone(shared)))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections and hands each to a thread of its own: the accepting thread never
/// reads from a peer, so a slow or silent one delays nobody.
fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off rather than spin.
                tracing::debug!(error = %e, "telemetry: accept failed");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let Some(open) = Open::take(&shared) else {
            refuse(&mut conn, &shared);
            continue;
        };
        // If the thread cannot start, the closure is dropped with the connection and its slot.
        let spawned = std::thread::Builder::new()
            .name("flowstate-telemetry-conn".into())
            .spawn(move || serve(conn, &open.0));
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "telemetry: cannot start a connection thread");
            shared.count(Ended::Refused);
        }
    }
}

/// Answers `503` without waiting: a fresh connection's send buffer takes the few bytes, and
/// if it does not, the peer gets nothing.
fn refuse(conn: &mut TcpStream, shared: &Shared) {
    shared.count(Ended::Refused);
    let _ = conn.set_nonblocking(true);
    let _ = conn.write(&http::Response::error(503, "Service Unavailable").to_bytes(false));
}

/// Where reading a request head got to.
enum Head {
    /// Parsed, or refused.
    Done(Result<http::Request, http::ParseError>),
    /// Not complete by the deadline.
    Pending,
    /// The peer closed or the connection failed: nothing to answer.
    Gone,
}

/// Reads into `buf` until the head is complete or `deadline` passes.
fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> Head {
    let mut chunk = [0u8; 1024];
    loop {
        match http::parse(buf) {
            Err(http::ParseError::Incomplete) => {}
            other => return Head::Done(other),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return Head::Pending;
        }
        match conn.read(&mut chunk) {
            Ok(0) => return Head::Gone,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Head::Pending
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Head::Gone,
        }
    }
}

/// Reads a request head (bounded in size and time), answers it and closes.
fn serve(mut conn: TcpStream, shared: &Shared) {
    let _ = conn.set_write_timeout(Some(shared.options.write_timeout));
    let mut buf = Vec::with_capacity(1024);
    let deadline = Instant::now() + shared.options.read_timeout;
    let (response, head_only) = match read_head(&mut conn, &mut buf, deadline) {
        Head::Pending => return shared.count(Ended::TimedOut),
        Head::Gone => return shared.count(Ended::Closed),
        Head::Done(Err(e)) => {
            let (code, reason) = e.status();
            (http::Response::error(code, reason), false)
        }
        Head::Done(Ok(req)) => {
            if let Some(opened) = open_stream(&req, shared) {
                return match opened {
                    Ok((rx, _streaming)) => stream(conn, &rx, shared),
                    Err(response) => {
                        shared.count(Ended::Refused);
                        let _ = conn.write_all(&response.to_bytes(false));
                    }
                };
            }
            let head_only = req.method == "HEAD";
            match Slot::take(&shared.answering, shared.options.max_answering) {
                Some(_answering) => (respond(&req, shared), head_only),
                None => (http::Response::error(503, "Service Unavailable"), false),
            }
        }
    };
    shared.count(match response.status {
        503 => Ended::Refused,
        401 => Ended::Unauthorized,
        _ => Ended::Answered,
    });
    let _ = conn.write_all(&response.to_bytes(head_only));
    let _ = conn.flush();
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// Whether `req` may be answered: no token is set, it presents the token, or it asks for
/// `/healthz` (a load balancer's or orchestrator's probe carries no secret).
fn authorized(req: &http::Request, shared: &Shared) -> bool {
    shared.options.token.as_ref().is_none_or(|token| {
        req.path == "/healthz" || req.bearer().is_some_and(|b| token.matches(b))
    })
}

/// A stream `req` asks for and may have, with its place among [`MAX_STREAMS`], or the
/// answer refusing it; `None`: not a stream (answered as a document).
fn open_stream<'a>(
    req: &http::Request,
    shared: &'a Shared,
) -> Option<Result<(Receiver<String>, Slot<'a>), http::Response>> {
    if req.method != "GET" || !authorized(req, shared) {
        return None;
    }
    let name = req.path.strip_prefix("/api/v1/")?;
    Some(match shared.provider.stream(name, req.query.as_deref())? {
        Err(why) => Err(http::Response::error_saying(400, "Bad Request", &why)),
        Ok(rx) => match Slot::take(&shared.streams, MAX_STREAMS) {
            Some(slot) => Ok((rx, slot)),
            None => Err(http::Response::error(503, "Service Unavailable")),
        },
    })
}

/// Streams the lines of `rx` to `conn` (`application/x-ndjson`) until the sender goes or the
/// peer does. A reader slower than the write timeout is dropped; the provider's queue for it
/// counts what it missed meanwhile.
fn stream(mut conn: TcpStream, rx: &Receiver<String>, shared: &Shared) {
    shared.count(Ended::Answered);
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\
                Cache-Control: no-store\r\nConnection: close\r\n\r\n";
    if conn.write_all(head.as_bytes()).is_err() {
        return;
    }
    let mut line = Vec::with_capacity(512);
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(l) => {
                line.clear();
                line.extend_from_slice(l.as_bytes());
                line.push(b'\n');
                if conn.write_all(&line).is_err() {
                    return;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if peer_closed(&conn) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Whether the peer closed its side (a reader says nothing after its request).
fn peer_closed(conn: &TcpStream) -> bool {
    if conn.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let closed = match conn.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    closed || conn.set_nonblocking(false).is_err()
}

/// The answer to a parsed request.
fn respond(req: &http::Request, shared: &Shared) -> http::Response {
    use http::Response;
    let provider = &*shared.provider;
    let not_allowed =
        || Response::error(405, "Method Not Allowed").with_header("Allow", "GET, HEAD");
    if !matches!(req.method.as_str(), "GET" | "HEAD" | "POST") {
        return not_allowed();
    }
    let path = req.path.as_str();
    if !authorized(req, shared) {
        return Response::error(401, "Unauthorized").with_header("WWW-Authenticate", "Bearer");
    }
    let guarded = |f: &dyn Fn() -> Response| {
        catch_unwind(AssertUnwindSafe(f))
            .unwrap_or_else(|_| Response::error(500, "Internal Server Error"))
    };
    if req.method == "POST" {
        let Some(name) = path.strip_prefix("/api/v1/") else {
            return not_allowed();
        };
        return guarded(&|| match provider.post(name) {
            Some(Ok(json)) => Response::ok("application/json", json),
            Some(Err(json)) => {
                let mut r = Response::ok("application/json", json);
                (r.status, r.reason) = (422, "Unprocessable Content");
                r
            }
            None => not_allowed(),
        });
    }
    match path {
        "/metrics" => guarded(&|| {
            let mut m = Metrics::new();
            provider.metrics(&mut m);
            shared.metrics(&mut m);
            Response::ok(OPENMETRICS, m.encode())
        }),
        "/healthz" => Response::ok("text/plain; charset=utf-8", "ok\n"),
        "/" => Response::ok("text/html; charset=utf-8", DASHBOARD),
        "/endpoints" => {
            guarded(&|| Response::ok("text/plain; charset=utf-8", endpoints(&provider.info())))
        }
        "/api/v1/info" => guarded(&|| Response::ok("application/json", provider.info().to_json())),
        _ => match path.strip_prefix("/api/v1/") {
            Some(name) if !name.is_empty() => match Page::parse(req.query.as_deref()) {
                Err(why) => Response::error_saying(400, "Bad Request", &why),
                Ok(page) => guarded(&|| match provider.api_page(name, &page) {
                    Some(json) => Response::ok("application/json", json),
                    None => Response::error(404, "Not Found"),
                }),
            },
            _ => Response::error(404, "Not Found"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Provider for Fixed {
        fn metrics(&self, m: &mut Metrics) {
            m.counter("requests", "Requests.", &[("kind", "get")], 3);
        }
        fn api(&self, name: &str) -> Option<String> {
            match name {
                "summary" => Some("{\"a\":1}".into()),
                "boom" => panic!("provider bug"),
                _ => None,
            }
        }
        fn post(&self, name: &str) -> Option<Result<String, String>> {
            match name {
                "reload" => Some(Ok("{\"ok\":1}".into())),
                "refused" => Some(Err("{\"errors\":[\"x\"]}".into())),
                _ => None,
            }
        }
    }

    fn get(addr: SocketAddr, raw: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(raw).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    }

    /// Streams three lines on `events`, then ends; refuses any query.
    struct Lines;
    impl Provider for Lines {
        fn metrics(&self, _: &mut Metrics) {}
        fn api(&self, _: &str) -> Option<String> {
            None
        }
        fn stream(
            &self,
            name: &str,
            query: Option<&str>,
        ) -> Option<Result<Receiver<String>, String>> {
            if name != "events" {
                return None;
            }
            if let Some(q) = query {
                return Some(Err(format!("unknown parameter {q}")));
            }
            let (tx, rx) = std::sync::mpsc::sync_channel(8);
            std::thread::spawn(move || {
                for i in 0..3 {
                    std::thread::sleep(Duration::from_millis(50));
                    let _ = tx.send(format!("{{\"n\":{i}}}"));
                }
            });
            Some(Ok(rx))
        }
    }

    #[test]
    fn streams_lines_until_the_sender_goes_and_guards_them_like_documents() {
        let token = Token::new("s3cret").unwrap();
        let options = Options {
            token: Some(token.clone()),
            ..Options::default()
        };
        let s =
            Server::start_with("127.0.0.1:0".parse().unwrap(), Arc::new(Lines), options).unwrap();
        let a = s.local_addr();
        let lines: Vec<String> =
            client::stream(a, "/api/v1/events", Duration::from_secs(5), Some(&token))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        assert_eq!(lines, ["{\"n\":0}", "{\"n\":1}", "{\"n\":2}"]);
        let no_token = client::stream(a, "/api/v1/events", Duration::from_secs(5), None);
        assert!(no_token.unwrap_err().to_string().contains("401"));
        let bad = client::stream(
            a,
            "/api/v1/events?x=1",
            Duration::from_secs(5),
            Some(&token),
        );
        let e = bad.unwrap_err().to_string();
        assert!(
            e.contains("400") && e.contains("unknown parameter x=1"),
            "{e}"
        );
        let raw = get(
            a,
            b"GET /api/v1/nope HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n",
        );
        assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    }

    #[test]
    fn serves_the_endpoints_and_refuses_the_rest() {
        let server = Server::start("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed)).unwrap();
        let a = server.local_addr();
        let m = get(a, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
        assert!(m.contains(OPENMETRICS));
        assert!(
            m.contains("flowstate_requests_total{kind=\"get\"} 3\n"),
            "{m}"
        );
        let s = get(a, b"GET /api/v1/summary HTTP/1.1\r\n\r\n");
        assert!(s.ends_with("\r\n\r\n{\"a\":1}"), "{s}");
        assert!(get(a, b"GET /healthz HTTP/1.0\r\n\r\n").ends_with("ok\n"));
        let page = get(a, b"GET / HTTP/1.1\r\n\r\n");
        assert!(
            page.contains("Content-Type: text/html; charset=utf-8\r\n"),
            "{page}"
        );
        assert!(page.ends_with(DASHBOARD));
        let list = get(a, b"GET /endpoints HTTP/1.1\r\n\r\n");
        for e in ["/metrics", "/api/v1/summary", "/api/v1/info", "/healthz"] {
            assert!(list.contains(&format!("  {e} ")), "{e} in {list}");
        }
        let info = get(a, b"GET /api/v1/info HTTP/1.1\r\n\r\n");
        assert!(
            info.ends_with("\r\n\r\n{\"role\":\"process\",\"document\":\"summary\"}"),
            "{info}"
        );
        assert!(get(a, b"GET /api/v1/nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(a, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let p = get(a, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(p.starts_with("HTTP/1.1 405"), "{p}");
        assert!(p.contains("Allow: GET, HEAD\r\n"));
        let post = |path: &str| {
            get(
                a,
                format!("POST {path} HTTP/1.1\r\nContent-Length: 0\r\n\r\n").as_bytes(),
            )
        };
        let r = post("/api/v1/reload");
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("{\"ok\":1}"),
            "{r}"
        );
        let r = post("/api/v1/refused");
        assert!(
            r.starts_with("HTTP/1.1 422 Unprocessable Content")
                && r.ends_with("{\"errors\":[\"x\"]}"),
            "{r}"
        );
        assert!(post("/api/v1/summary").starts_with("HTTP/1.1 405"));
        assert!(get(a, b"DELETE /api/v1/reload HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(get(a, b"GET /api/v1/boom HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 500"));
        assert!(get(a, b"garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        let h = get(a, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            h.starts_with("HTTP/1.1 200") && h.ends_with("\r\n\r\n"),
            "{h}"
        );
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(http::MAX_HEAD * 2, b'a');
        let mut c = TcpStream::connect(a).unwrap();
        let _ = c.write_all(&big);
        let mut s = String::new();
        let _ = c.read_to_string(&mut s);
        assert!(s.starts_with("HTTP/1.1 431"), "{s}");
        // A peer that closes without a word is no harm to the next one.
        drop(TcpStream::connect(a).unwrap());
        assert!(get(a, b"GET /healthz HTTP/1.1\r\n\r\n").ends_with("ok\n"));
        server.stop();
    }

    #[test]
    fn a_slow_peer_is_served_on_its_own_thread_and_others_meanwhile() {
        let server = Server::start("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed)).unwrap();
        let a = server.local_addr();
        let mut slow = TcpStream::connect(a).unwrap();
        slow.write_all(b"GET /heal").unwrap();
        assert!(get(a, b"GET /healthz HTTP/1.1\r\n\r\n").ends_with("ok\n"));
        slow.write_all(b"thz HTTP/1.1\r\n\r\n").unwrap();
        let mut s = String::new();
        slow.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.1 200") && s.ends_with("ok\n"), "{s}");
        server.stop();
    }

    /// Whether `c` has neither been answered nor closed by the server.
    fn untouched(c: &mut TcpStream) -> bool {
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        let r = c.read(&mut b);
        c.set_nonblocking(false).unwrap();
        matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// The value of an unlabelled sample `name` in an exposition.
    fn sample(page: &str, name: &str) -> Option<u64> {
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_request_is_answered_while_200_silent_peers_are_still_waiting() {
        // A read timeout far beyond the test: every silent peer is still being waited for
        // when the real request is answered, whatever the machine's load.
        let options = Options {
            read_timeout: Duration::from_secs(600),
            ..Options::default()
        };
        let server =
            Server::start_with("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed), options).unwrap();
        let a = server.local_addr();
        let mut silent: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(a).unwrap()).collect();
        // Accepted after all of them (the accept queue is in order of arrival).
        let m = get(a, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
        assert!(
            m.contains("flowstate_requests_total{kind=\"get\"} 3\n"),
            "{m}"
        );
        assert_eq!(
            sample(&m, "flowstate_telemetry_open_connections"),
            Some(201),
            "{m}"
        );
        for (i, c) in silent.iter_mut().enumerate() {
            assert!(untouched(c), "silent peer {i} was answered or closed");
        }
        drop(silent);
        server.stop();
    }

    #[test]
    fn beyond_the_open_connections_bound_a_peer_gets_503_and_it_is_counted() {
        let options = Options {
            max_open: 2,
            read_timeout: Duration::from_secs(600),
            ..Options::default()
        };
        let server =
            Server::start_with("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed), options).unwrap();
        let a = server.local_addr();
        let mut first = TcpStream::connect(a).unwrap();
        let _second = TcpStream::connect(a).unwrap();
        // Refused as soon as accepted; it sends nothing, so that the close is not a reset for
        // unread bytes.
        let mut third = TcpStream::connect(a).unwrap();
        let mut s = String::new();
        third.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.1 503"), "{s}");
        assert!(untouched(&mut first));
        // The first one still gets its answer, which counts the refusal.
        first.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut m = String::new();
        first.read_to_string(&mut m).unwrap();
        assert!(
            m.contains("flowstate_telemetry_connections_total{result=\"refused\"} 1\n"),
            "{m}"
        );
        server.stop();
    }

    #[test]
    fn a_peer_silent_past_the_read_timeout_is_closed_and_counted() {
        let options = Options {
            read_timeout: Duration::from_millis(50),
            ..Options::default()
        };
        let server =
            Server::start_with("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed), options).unwrap();
        let a = server.local_addr();
        let mut silent = TcpStream::connect(a).unwrap();
        let mut s = Vec::new();
        silent.read_to_end(&mut s).unwrap();
        assert!(s.is_empty(), "{s:?}");
        // Counted once its thread is done with it: ask until it is.
        let mut metrics = String::new();
        for _ in 0..1000 {
            metrics = get(a, b"GET /metrics HTTP/1.1\r\n\r\n");
            if metrics.contains("{result=\"timed_out\"} 1\n") {
                break;
            }
            std::thread::yield_now();
        }
        assert!(metrics.contains("{result=\"timed_out\"} 1\n"), "{metrics}");
        server.stop();
    }

    #[test]
    fn with_a_token_only_healthz_answers_without_it() {
        let options = Options {
            token: Some(Token::new("s3cret").unwrap()),
            ..Options::default()
        };
        let server =
            Server::start_with("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed), options).unwrap();
        let a = server.local_addr();
        for path in [
            "/metrics",
            "/api/v1/summary",
            "/api/v1/info",
            "/",
            "/endpoints",
            "/nope",
        ] {
            for auth in [
                "",
                "Authorization: Bearer wrong\r\n",
                "Authorization: Basic s3cret\r\n",
            ] {
                let r = get(a, format!("GET {path} HTTP/1.1\r\n{auth}\r\n").as_bytes());
                assert!(
                    r.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
                    "{path} {auth}: {r}"
                );
                assert!(r.contains("WWW-Authenticate: Bearer\r\n"), "{r}");
                assert!(!r.contains("\"a\":1"), "{r}");
            }
        }
        let ok = get(
            a,
            b"GET /api/v1/summary HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n",
        );
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.ends_with("{\"a\":1}"),
            "{ok}"
        );
        let ok = get(
            a,
            b"GET /metrics HTTP/1.1\r\nauthorization: bearer s3cret\r\n\r\n",
        );
        assert!(ok.contains("{result=\"unauthorized\"} 18\n"), "{ok}");
        assert!(get(a, b"GET /healthz HTTP/1.1\r\n\r\n").ends_with("ok\n"));
        let twice = get(
            a,
            b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret\r\nAuthorization: Bearer x\r\n\r\n",
        );
        assert!(twice.starts_with("HTTP/1.1 400"), "{twice}");
        server.stop();
    }

    /// A provider of one long document, `rows`: the numbers 0..25 as strings.
    struct Rows;
    impl Provider for Rows {
        fn metrics(&self, _: &mut Metrics) {}
        fn api(&self, name: &str) -> Option<String> {
            self.api_page(name, &Page::default())
        }
        fn api_page(&self, name: &str, page: &Page) -> Option<String> {
            (name == "rows").then(|| {
                let rows = (0..25).map(|i| (format!("{i:02}").into_bytes(), i.to_string()));
                let (rows, next) = page.select(rows.collect());
                let next = next.map_or("null".to_owned(), |c| json_string(&c.encode()));
                format!("{{\"rows\":[{}],\"next\":{next}}}", rows.join(","))
            })
        }
    }

    #[test]
    fn a_long_document_is_answered_a_page_at_a_time() {
        let server = Server::start("127.0.0.1:0".parse().unwrap(), Arc::new(Rows)).unwrap();
        let a = server.local_addr();
        let body = |r: String| r.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap();
        let first = body(get(a, b"GET /api/v1/rows?limit=10 HTTP/1.1\r\n\r\n"));
        assert!(
            first.starts_with("{\"rows\":[0,1,2,3,4,5,6,7,8,9],\"next\":\""),
            "{first}"
        );
        let mut all = Vec::new();
        let mut after = String::new();
        loop {
            let r = body(get(
                a,
                format!("GET /api/v1/rows?limit=10{after} HTTP/1.1\r\n\r\n").as_bytes(),
            ));
            let (rows, next) = r.split_once("],\"next\":").unwrap();
            all.extend(
                rows.trim_start_matches("{\"rows\":[")
                    .split(',')
                    .map(str::to_owned),
            );
            match next.trim_end_matches('}') {
                "null" => break,
                c => after = format!("&after={}", c.trim_matches('"')),
            }
        }
        assert_eq!(all, (0..25).map(|i| i.to_string()).collect::<Vec<_>>());
        for (query, names) in [
            ("limit=x", "limit"),
            ("limit=0", "limit"),
            ("after=zz", "after"),
        ] {
            let r = get(
                a,
                format!("GET /api/v1/rows?{query} HTTP/1.1\r\n\r\n").as_bytes(),
            );
            assert!(r.starts_with("HTTP/1.1 400"), "{query}: {r}");
            assert!(
                r.contains(&format!("400 Bad Request: {names}: ")),
                "{query}: {r}"
            );
        }
        server.stop();
    }

    #[test]
    fn the_dashboard_loads_nothing_from_elsewhere() {
        // Works offline: no script, style sheet, font or image from another place, and every
        // request it makes is relative to the listener.
        for outside in ["src=", "<link", "@import", "url(", "://"] {
            assert!(!DASHBOARD.contains(outside), "{outside} in the dashboard");
        }
        assert!(DASHBOARD.contains("fetch(path"));
        assert!(DASHBOARD.contains("\"api/v1/info\""));
    }

    #[test]
    fn info_is_json_whatever_the_names() {
        let i = Info {
            role: "a \"quoted\\ role\n".into(),
            document: "stats".into(),
        };
        assert_eq!(
            i.to_json(),
            r#"{"role":"a \"quoted\\ role\u000a","document":"stats"}"#
        );
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("9464").unwrap(), DEFAULT_LISTEN);
        assert_eq!(parse_listen(":9464").unwrap(), DEFAULT_LISTEN);
        assert_eq!(parse_listen("localhost:9464").unwrap(), DEFAULT_LISTEN);
        assert_eq!(
            parse_listen("0.0.0.0:1").unwrap(),
            "0.0.0.0:1".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:80").unwrap(),
            "[::1]:80".parse().unwrap()
        );
        assert!(parse_listen("nohost").is_err());
        assert!(parse_listen("1.2.3.4").is_err());
        assert!(parse_listen("70000").is_err());
    }
}
