//! `store-abuse` (issue #37): a well-behaved client of the store (one connection, one request
//! in flight, a set or a get of 100 bytes each) alone, then with adversarial clients beside it:
//!
//! * amplifiers (with the token): batches of 2,000 `Get`s of a 256 KiB value (500 MiB of
//!   answers from a 40 KB frame), two reading their answers and two never reading;
//! * fresh client ids (with the token): a new connection and client id for every batch, each
//!   batch's answer 256 KiB, kept for retransmissions;
//! * slow partial frames: connections announcing the largest frame and sending 1 KiB of it
//!   every 50 ms, half of them after the token, half before;
//! * idle connections at the limit: connections opened without a hello until the store
//!   refuses more, opened again as the handshake timeout closes them.
//!
//! It reports the good client's operations per second and p50/p99 latency alone, beside each
//! kind of adversary on its own (`ratios.p99_beside_KIND_vs_alone`) and beside all of them
//! (`ratios.p99_under_abuse_vs_alone`, `ratios.ops_under_abuse_vs_alone`), the process's peak
//! resident memory under abuse (`metrics.rss_peak_mb_under_abuse`) against the bound the
//! store's configuration sets (`metrics.memory_bound_mb`: resident memory alone, the answers
//! kept, 128 KiB per connection and, per client with the token, two frames and the unsent
//! output), and the store's counters of each limit hit. The store runs in this process: its
//! resident memory is the process's (the adversaries keep no answers).

use crate::soak::rss_bytes;
use crate::{Effort, Report};
use flowstate_proto::{self as proto, Frame, Limits, Message, Op, Request, HEADER_LEN, VERSION};
use flowstate_store::{Config, Secret, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-token";
const MAX_FRAME: u32 = 4 << 20;
const MAX_OUTPUT: usize = 4 << 20;
const MAX_CONNECTIONS: usize = 256;
const MAX_REPLY_CACHE: usize = 32 << 20;
const AMPLIFIERS: usize = 4;
const FRESH_ID_CLIENTS: usize = 1;
const SLOW_FRAMES: usize = 64;
/// Bytes per connection besides its frames: its input and output buffers' first allocation.
const PER_CONNECTION: usize = 128 << 10;

pub(crate) fn run(effort: Effort) -> Report {
    let phase = match effort {
        Effort::Full => Duration::from_secs(10),
        Effort::Quick => Duration::from_millis(500),
    };
    let mut report = Report::new("store-abuse");
    report
        .param("phase_secs", phase.as_secs_f64())
        .param(
            "good_client",
            "1 connection, 1 request in flight, set or get of 100 B",
        )
        .param("max_frame", MAX_FRAME)
        .param("max_output", MAX_OUTPUT as u64)
        .param("max_connections", MAX_CONNECTIONS as u64)
        .param("max_reply_cache", MAX_REPLY_CACHE as u64)
        .param("handshake_timeout_secs", 1.0)
        .param(
            "adversaries",
            format!(
                "{AMPLIFIERS} amplifiers (2 reading), {FRESH_ID_CLIENTS} fresh-id client, \
                 {SLOW_FRAMES} slow partial frames (half before the token), idle connections \
                 up to the limit"
            ),
        );
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        token: Some(Secret::new(TOKEN)),
        limits: Limits {
            max_frame: MAX_FRAME,
            ..Limits::default()
        },
        max_output: MAX_OUTPUT,
        max_connections: MAX_CONNECTIONS,
        max_reply_cache: MAX_REPLY_CACHE,
        handshake_timeout: Duration::from_secs(1),
        ..Config::default()
    })
    .expect("start the store");
    let addr = server.local_addr();
    let mut setup = Client::hello(addr, 1).expect("connect");
    setup.call(vec![Op::Set {
        key: b"big".to_vec(),
        value: vec![7; 256 << 10],
    }]);
    setup.call(vec![Op::Set {
        key: b"medium".to_vec(),
        value: vec![7; 64 << 10],
    }]);
    let mut good = Client::hello(addr, 2).expect("connect");
    good_client(&mut good, phase / 5);
    let alone = good_client(&mut good, phase);
    let rss_alone = resident_bytes();

    let mut under = Vec::new();
    for kinds in [
        &[Adversary::Amplifiers][..],
        &[Adversary::FreshIds],
        &[Adversary::SlowFrames],
        &[Adversary::IdleAtLimit],
        &ALL,
    ] {
        under.push(abuse(addr, kinds, phase, &mut good, rss_alone));
    }
    let (abused, peak, refused) = under.pop().expect("the run of every adversary");
    for (kind, (rate, _, _)) in ALL.iter().zip(&under) {
        let name = kind.name();
        report
            .metric(&format!("good_p99_us_beside_{name}"), rate.p99_us)
            .metric(&format!("good_ops_per_sec_beside_{name}"), rate.ops_per_sec)
            .ratio(
                &format!("p99_beside_{name}_vs_alone"),
                rate.p99_us / alone.p99_us.max(1e-3),
            );
    }

    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    let authed = (AMPLIFIERS + FRESH_ID_CLIENTS + SLOW_FRAMES / 2) as u64;
    let bound = rss_alone
        + MAX_REPLY_CACHE as u64
        + (MAX_CONNECTIONS * PER_CONNECTION) as u64
        + authed * (2 * u64::from(MAX_FRAME) + MAX_OUTPUT as u64);
    for (name, r) in [("alone", &alone), ("under_abuse", &abused)] {
        report
            .metric(&format!("good_ops_per_sec_{name}"), r.ops_per_sec)
            .metric(&format!("good_p50_us_{name}"), r.p50_us)
            .metric(&format!("good_p99_us_{name}"), r.p99_us);
    }
    report
        .metric("rss_alone_mb", mb(rss_alone))
        .metric("rss_peak_mb_under_abuse", mb(peak))
        .metric("memory_bound_mb", mb(bound))
        .metric("connections_refused_at_the_limit", refused as f64);
    let stats = server.stats();
    for name in [
        "timeouts",
        "answers_cut",
        "replies_dropped",
        "clients_forgotten",
        "kept_answer_bytes",
        "errors",
    ] {
        if let Some((_, v)) = stats.iter().find(|(n, _)| n == name) {
            report.metric(&format!("store_{name}"), *v as f64);
        }
    }
    report
        .ratio(
            "p99_under_abuse_vs_alone",
            abused.p99_us / alone.p99_us.max(1e-3),
        )
        .ratio(
            "ops_under_abuse_vs_alone",
            abused.ops_per_sec / alone.ops_per_sec.max(1e-9),
        )
        .ratio("rss_peak_vs_memory_bound", peak as f64 / bound as f64);
    server.stop();
    report
}

/// A kind of adversarial client.
#[derive(Clone, Copy)]
enum Adversary {
    Amplifiers,
    FreshIds,
    SlowFrames,
    IdleAtLimit,
}

const ALL: [Adversary; 4] = [
    Adversary::Amplifiers,
    Adversary::FreshIds,
    Adversary::SlowFrames,
    Adversary::IdleAtLimit,
];

impl Adversary {
    fn name(self) -> &'static str {
        match self {
            Adversary::Amplifiers => "amplifiers",
            Adversary::FreshIds => "fresh_ids",
            Adversary::SlowFrames => "slow_frames",
            Adversary::IdleAtLimit => "idle_at_limit",
        }
    }
}

/// The good client's rate and latency over `phase` beside the adversaries `kinds` (started a
/// fifth of a phase before, to reach their steady state), the peak resident memory meanwhile
/// and the connections the store refused at its limit.
fn abuse(
    addr: SocketAddr,
    kinds: &[Adversary],
    phase: Duration,
    good: &mut Client,
    rss_alone: u64,
) -> (Rate, u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    let mut spawn = |f: Box<dyn FnOnce(&AtomicBool) + Send>| {
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            background();
            f(&stop)
        }));
    };
    for kind in kinds {
        match kind {
            Adversary::Amplifiers => {
                for i in 0..AMPLIFIERS {
                    spawn(Box::new(move |s| {
                        amplify(addr, 100 + i as u64, i % 2 == 0, s)
                    }));
                }
            }
            Adversary::FreshIds => {
                for i in 0..FRESH_ID_CLIENTS {
                    spawn(Box::new(move |s| {
                        fresh_ids(addr, 1 << 40 | (i as u64) << 32, s)
                    }));
                }
            }
            Adversary::SlowFrames => {
                for i in 0..SLOW_FRAMES {
                    spawn(Box::new(move |s| {
                        slow_frame(addr, 200 + i as u64, i % 2 == 0, s)
                    }));
                }
            }
            Adversary::IdleAtLimit => {
                let refused = refused.clone();
                spawn(Box::new(move |s| idle_fill(addr, s, &refused)));
            }
        }
    }
    let peak = Arc::new(AtomicU64::new(rss_alone));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(resident_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    std::thread::sleep(phase / 5);
    let rate = good_client(good, phase);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let _ = sampler.join();
    (
        rate,
        peak.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    )
}

/// The good client's rate and latency over `phase`.
struct Rate {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

fn good_client(c: &mut Client, phase: Duration) -> Rate {
    let mut lat = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < phase {
        let key = format!("good{}", i % 1000).into_bytes();
        let op = match i % 2 {
            0 => Op::Set {
                key,
                value: vec![1; 100],
            },
            _ => Op::Get { key },
        };
        let t = Instant::now();
        c.call(vec![op]);
        lat.push(t.elapsed());
        i += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Rate {
        ops_per_sec: lat.len() as f64 / wall,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
    }
}

/// A raw connection that said hello with the token.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    next: u64,
}

impl Client {
    fn hello(addr: SocketAddr, client: u64) -> Option<Client> {
        let s = TcpStream::connect(addr).ok()?;
        s.set_nodelay(true).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut c = Client {
            s,
            buf: Vec::with_capacity(1 << 16),
            next: 1,
        };
        c.send(&Message::Hello {
            client,
            token: TOKEN.as_bytes().to_vec(),
        })?;
        matches!(c.read()?, Message::Welcome { .. }).then_some(c)
    }

    fn send(&mut self, msg: &Message) -> Option<()> {
        let frame = Client::encode(self.next, msg.clone());
        self.next += 1;
        self.s.write_all(&frame).ok()
    }

    fn encode(id: u64, msg: Message) -> Vec<u8> {
        let mut out = Vec::new();
        proto::encode(&Frame { id, msg }, &mut out);
        out
    }

    /// Reads one frame and throws it away unread (as cheap for the client as it can be).
    fn skip(&mut self) -> Option<()> {
        let mut chunk = [0u8; 1 << 16];
        loop {
            if let Some(len) = self.buf.get(..4) {
                let total = 4 + u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                if self.buf.len() >= total {
                    self.buf.drain(..total);
                    return Some(());
                }
                if self.buf.len() > 4 {
                    // The rest of a large frame: read and drop, keeping only what is owed.
                    let owed = total - self.buf.len();
                    self.buf.truncate(4);
                    self.buf[..4].copy_from_slice(&((owed as u32).to_le_bytes()));
                    // `owed` counts bytes after these four, as a length does.
                    let left = owed;
                    self.buf[..4].copy_from_slice(&(left as u32).to_le_bytes());
                }
            }
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn read(&mut self) -> Option<Message> {
        let limits = Limits {
            max_frame: 2 * MAX_FRAME,
            ..Limits::default()
        };
        let mut chunk = [0u8; 1 << 16];
        loop {
            if let Ok(Some((f, used))) = proto::decode(&self.buf, &limits) {
                self.buf.drain(..used);
                return Some(f.msg);
            }
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn batch(op_id: u64, ops: Vec<Op>) -> Message {
        Message::Batch {
            op_id,
            ack_only: false,
            ops: ops.into_iter().map(Request::from).collect(),
        }
    }

    /// Sends `ops` in one batch and waits for the answer.
    fn call(&mut self, ops: Vec<Op>) {
        self.send(&Client::batch(0, ops))
            .expect("the good client's request");
        match self.read() {
            Some(Message::Replies(_)) => {}
            other => panic!("the good client got {other:?}"),
        }
    }
}

/// Batches of 2,000 `Get`s of the 256 KiB value, answers read or never read.
fn amplify(addr: SocketAddr, client: u64, reads: bool, stop: &AtomicBool) {
    let get = Client::encode(
        1,
        Client::batch(
            0,
            vec![
                Op::Get {
                    key: b"big".to_vec()
                };
                2000
            ],
        ),
    );
    while !stop.load(Ordering::Relaxed) {
        let Some(mut c) = Client::hello(addr, client) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if !reads {
            // Batches until the store stops reading them (its output bound), then hold on.
            let _ = c.s.set_write_timeout(Some(Duration::from_millis(100)));
            while !stop.load(Ordering::Relaxed) && c.s.write_all(&get).is_ok() {}
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        while !stop.load(Ordering::Relaxed) && c.s.write_all(&get).is_ok() && c.skip().is_some() {}
    }
}

/// A new connection and client id for each batch, whose answer (256 KiB) is kept.
fn fresh_ids(addr: SocketAddr, first: u64, stop: &AtomicBool) {
    let mut id = first;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        if let Some(mut c) = Client::hello(addr, id) {
            let ops = vec![
                Op::Get {
                    key: b"medium".to_vec()
                };
                4
            ];
            if c.send(&Client::batch(1, ops)).is_some() {
                let _ = c.skip();
            }
        }
    }
}

/// A frame announced at the largest size and sent 1 KiB every 50 ms, after the token or
/// before.
fn slow_frame(addr: SocketAddr, client: u64, authed: bool, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let s = match authed {
            true => Client::hello(addr, client).map(|c| c.s),
            false => TcpStream::connect(addr).ok(),
        };
        let Some(mut s) = s else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let mut head = Vec::with_capacity(HEADER_LEN);
        head.extend_from_slice(&(MAX_FRAME - 4).to_le_bytes());
        head.extend_from_slice(&[VERSION, 3, 0, 0]);
        head.extend_from_slice(&1u64.to_le_bytes());
        if s.write_all(&head).is_err() {
            continue;
        }
        while !stop.load(Ordering::Relaxed) && s.write_all(&[0; 1024]).is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Connections without a hello, opened until the store refuses more and again as it closes
/// them (64 every 10 ms); a connection closed with an answer within 200 ms of its opening was
/// refused at the limit, a later one closed by the handshake timeout.
fn idle_fill(addr: SocketAddr, stop: &AtomicBool, refused: &AtomicU64) {
    let mut open: Vec<(TcpStream, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        open.retain(|(s, at)| {
            let closed = answered(s);
            if closed && at.elapsed() < Duration::from_millis(200) {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            !closed
        });
        for _ in 0..64 {
            match TcpStream::connect(addr) {
                Ok(s) if s.set_nonblocking(true).is_ok() => open.push((s, Instant::now())),
                _ => break,
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the store sent something on `s` or closed it (a read that neither blocks nor
/// times out).
fn answered(mut s: &TcpStream) -> bool {
    match s.read_exact(&mut [0u8; 1]) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::UnexpectedEof,
    }
}

/// Runs the calling thread at the lowest priority (nice 19): the adversaries stand for clients
/// on other hosts, so their own CPU time must not come out of the store's or the good
/// client's (on two cores, five busy threads would otherwise measure the scheduler).
fn background() {
    // SAFETY: gettid and setpriority only read their arguments.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

/// Resident memory of this process (0 where it cannot be read).
fn resident_bytes() -> u64 {
    rss_bytes().unwrap_or(0)
}
