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
//!   answers `summary` (its run summary so far), the store `stats`.
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
//!   ([`parse_listen`], [`DEFAULT_LISTEN`]).
//! * Nothing a peer sends makes the server panic: request heads are bounded
//!   ([`http::MAX_HEAD`]), reads and writes have timeouts, a request line that is not
//!   `GET|HEAD /path HTTP/1.x` gets a 4xx/5xx status, at most [`MAX_CONNECTIONS`] requests are
//!   served at once (more get `503`), and a provider that panics gives a `500`.
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

pub use metrics::{Histogram, Metrics};

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The listener's default address: loopback, Prometheus' usual exporter port range.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9464);

/// Requests served at once; more are answered `503` and closed.
pub const MAX_CONNECTIONS: usize = 8;

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

    /// What the process is and which [`Provider::api`] document holds its numbers.
    fn info(&self) -> Info {
        Info::default()
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
    /// Binds `addr` (port 0 picks a free port) and serves `provider` on a thread of its own.
    pub fn start(addr: SocketAddr, provider: Arc<dyn Provider>) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the telemetry listener is reachable from other hosts");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("flowstate-telemetry".into())
            .spawn(move || accept_loop(listener, provider, flag))?;
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

    /// Stops accepting and waits for the accepting thread (requests being served finish on
    /// their own threads).
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

fn accept_loop(listener: TcpListener, provider: Arc<dyn Provider>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
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
        // Most requests (a scraper's, curl's) arrive with the connection: read and answer
        // them on this thread, which saves a thread per scrape. A head not complete within
        // INLINE_WAIT goes on on a thread of its own, so a slow peer delays others that long
        // at most.
        let mut buf = Vec::with_capacity(1024);
        match read_head(&mut conn, &mut buf, Instant::now() + INLINE_WAIT) {
            Head::Gone => continue,
            Head::Done(parsed) => {
                let _ = conn.set_write_timeout(Some(INLINE_WAIT * 10));
                answer(conn, parsed, &*provider);
                continue;
            }
            Head::Pending => {}
        }
        let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ =
                conn.write_all(&http::Response::error(503, "Service Unavailable").to_bytes(false));
            continue;
        }
        let provider = Arc::clone(&provider);
        let count = Arc::clone(&active);
        let spawned = std::thread::Builder::new()
            .name("flowstate-telemetry-conn".into())
            .spawn(move || {
                serve(conn, buf, &*provider);
                count.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// How long the accepting thread waits for a request head itself.
const INLINE_WAIT: Duration = Duration::from_millis(50);

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

/// Reads the rest of a request head (bounded in size and time) and answers it.
fn serve(mut conn: TcpStream, mut buf: Vec<u8>, provider: &dyn Provider) {
    match read_head(&mut conn, &mut buf, Instant::now() + READ_TIMEOUT) {
        Head::Done(parsed) => answer(conn, parsed, provider),
        Head::Pending | Head::Gone => {}
    }
}

/// Writes the answer to a request head and closes.
fn answer(
    mut conn: TcpStream,
    parsed: Result<http::Request, http::ParseError>,
    provider: &dyn Provider,
) {
    let (response, head_only) = match parsed {
        Ok(req) => {
            let head = req.method == "HEAD";
            (respond(&req, provider), head)
        }
        Err(e) => {
            let (code, reason) = e.status();
            (http::Response::error(code, reason), false)
        }
    };
    let _ = conn.write_all(&response.to_bytes(head_only));
    let _ = conn.flush();
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// The answer to a parsed request.
pub fn respond(req: &http::Request, provider: &dyn Provider) -> http::Response {
    use http::Response;
    if req.method != "GET" && req.method != "HEAD" {
        let mut r = Response::error(405, "Method Not Allowed");
        r.allow = Some("GET, HEAD");
        return r;
    }
    let path = req.path.as_str();
    let guarded = |f: &dyn Fn() -> Response| {
        catch_unwind(AssertUnwindSafe(f))
            .unwrap_or_else(|_| Response::error(500, "Internal Server Error"))
    };
    match path {
        "/metrics" => guarded(&|| {
            let mut m = Metrics::new();
            provider.metrics(&mut m);
            Response::ok(OPENMETRICS, m.encode())
        }),
        "/healthz" => Response::ok("text/plain; charset=utf-8", "ok\n"),
        "/" => Response::ok("text/html; charset=utf-8", DASHBOARD),
        "/endpoints" => {
            guarded(&|| Response::ok("text/plain; charset=utf-8", endpoints(&provider.info())))
        }
        "/api/v1/info" => guarded(&|| Response::ok("application/json", provider.info().to_json())),
        _ => match path.strip_prefix("/api/v1/") {
            Some(name) if !name.is_empty() => guarded(&|| match provider.api(name) {
                Some(json) => Response::ok("application/json", json),
                None => Response::error(404, "Not Found"),
            }),
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
    }

    fn get(addr: SocketAddr, raw: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(raw).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
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
        // Past the accepting thread's own wait: the slow request moves to a thread.
        std::thread::sleep(INLINE_WAIT * 3);
        assert!(get(a, b"GET /healthz HTTP/1.1\r\n\r\n").ends_with("ok\n"));
        slow.write_all(b"thz HTTP/1.1\r\n\r\n").unwrap();
        let mut s = String::new();
        slow.read_to_string(&mut s).unwrap();
        assert!(s.starts_with("HTTP/1.1 200") && s.ends_with("ok\n"), "{s}");
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
