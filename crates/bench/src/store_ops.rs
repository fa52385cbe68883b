//! The state store's own benchmarks (issue 4; CHC §7.1 "Datastore performance", StatelessNF
//! §5.3 batching):
//!
//! * `store-ops`: our store (`flowstate-store`, one shard thread, pinned to CPU 0) against a
//!   real `redis-server` (persistence off, pinned to CPU 0 with `taskset` when there is
//!   one), the same operation mix (set, get, incr, list push, list pop) at pipeline depths 1,
//!   16 and 64: ops/s, p50/p99 latency, and operations per second of server CPU time, with
//!   the ratios ours/Redis. Server CPU time is measured the same way for both, from each
//!   thread's `/proc/<pid>/task/<tid>/schedstat`: all of Redis's threads, and our store's own
//!   threads (`store-*`; the client thread in the same process is not counted). Redis is
//!   skipped (and its ratios left out) when `redis-server` is not on the PATH.
//!
//!   One client thread (on the last CPU) drives every run from its own event loop, each
//!   connection keeping a window of `depth` requests in flight; the requests are encoded
//!   before the clock starts, so the client can keep a server core busy. The runs (`RUNS`):
//!   one connection at each depth (keys `..._depthN`: lock-step with one client, where both
//!   servers spend most of their CPU time being woken and waking the client), then 4, 16 and
//!   64 connections (keys `..._depthN_clientsC`; 16 and 64 keep one server core busy, the
//!   capacity of a core that CHC §7.1 measures). Every run sends one operation per frame, as
//!   Redis gets one command per request; at depth 64 our store also runs each window as one
//!   multi-op frame, as its own client (`flowstate-driver-store`) sends a flush (keys
//!   `store_batched_...`, compared with the same Redis run). A run is 300,000 operations,
//!   sent again in rounds until at least a second has passed (`MIN_RUN`).
//! * `store-batching`: the effective per-operation cost through the `store` driver of single
//!   requests against multi-op frames of 100 operations.

use crate::{Effort, Report};
use flowstate_driver_store::StoreConnector;
use flowstate_proto::{self as proto, Limits, Message, Op};
use flowstate_state::{Backend, Kind, ObjectKey, Op as SOp};
use flowstate_store::{Config, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The runs, as (client connections, pipeline depth): one connection at depths 1, 16 and 64
/// first (keys `..._depthN`), then more connections (keys `..._depthN_clientsC`).
const RUNS: [(usize, usize); 7] = [
    (1, 1),
    (1, 16),
    (1, 64),
    (4, 16),
    (4, 64),
    (16, 64),
    (64, 64),
];
/// The depth at which our store runs a second time with each window of requests in one
/// multi-op frame, as its own client (`flowstate-driver-store`) sends them (keys
/// `store_batched_...`; Redis has no multi-command frame and is compared as pipelined).
const BATCHED_DEPTH: usize = 64;

/// Least time a measured run lasts: its requests are sent again, round after round, until it
/// has passed (a run of 300,000 operations takes 60 ms on a busy core, too short to measure on
/// a shared VM). The mix stays valid when replayed: sets overwrite, every push is popped.
const MIN_RUN: Duration = Duration::from_secs(1);

/// Latency and rate of one run.
struct Run {
    /// Operations measured (whole rounds of the run's requests).
    ops: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Server CPU seconds used during the run.
    server_cpu_s: f64,
}

impl Run {
    /// Operations per second of server CPU time.
    fn ops_per_cpu_sec(&self) -> f64 {
        self.ops as f64 / self.server_cpu_s.max(1e-3)
    }
}

pub(crate) fn run_ops(effort: Effort) -> Report {
    let (ops, min_run) = match effort {
        Effort::Full => (300_000usize, MIN_RUN),
        Effort::Quick => (3_000, Duration::ZERO),
    };
    let mut report = Report::new("store-ops");
    report
        .param("ops_per_round", ops as u64)
        .param("min_run_secs", min_run.as_secs_f64())
        .param("mix", "set, get, incr, list push, list pop (equal shares)")
        .param("store_shards", 1)
        .param("store_cpu", 0)
        .param(
            "runs",
            RUNS.map(|(c, d)| format!("{c}x{d}")).join(" ") + " (connections x depth)",
        );
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        shards: 1,
        // On CPU 0, as Redis.
        cpus: vec![0],
        ..Config::default()
    })
    .expect("start the store");
    let redis = Redis::start();
    report.param(
        "redis",
        redis
            .as_ref()
            .map_or("not found".into(), |r| r.version.clone()),
    );
    let ours_reqs = Requests::new(Wire::Ours, ops, 1);
    let batched_reqs = Requests::new(Wire::Ours, ops, BATCHED_DEPTH);
    let redis_reqs = redis.as_ref().map(|_| Requests::new(Wire::Redis, ops, 1));
    let mut ours = Vec::new();
    let addr = server.local_addr();
    for (connections, depth) in RUNS {
        let tag = match connections {
            1 => format!("depth{depth}"),
            c => format!("depth{depth}_clients{c}"),
        };
        let shape = Shape {
            connections,
            depth,
            ops,
            min_run,
        };
        let r = measure(addr, &ours_reqs, shape, &store_threads_cpu);
        report_run(&mut report, "store", &tag, &r);
        let rb = (depth == BATCHED_DEPTH).then(|| {
            let rb = measure(addr, &batched_reqs, shape, &store_threads_cpu);
            report_run(&mut report, "store_batched", &tag, &rb);
            rb
        });
        if let (Some(redis), Some(reqs)) = (&redis, &redis_reqs) {
            let pid = redis.child.id().to_string();
            let rr = measure(redis.addr, reqs, shape, &|| threads_cpu(&pid, ""));
            report_run(&mut report, "redis", &tag, &rr);
            report_vs_redis(&mut report, "store", &tag, &r, &rr);
            if let Some(rb) = &rb {
                report_vs_redis(&mut report, "store_batched", &tag, rb, &rr);
            }
        }
        if connections == 1 {
            ours.push(r.ops_per_sec);
        }
    }
    report.ratio("store_depth64_vs_depth1", ours[2] / ours[0]);
    report.ratio("store_depth16_vs_depth1", ours[1] / ours[0]);
    drop(redis);
    server.stop();
    report
}

/// Reports a run's metrics as `<server>_<name>_<tag>`.
fn report_run(report: &mut Report, server: &str, tag: &str, r: &Run) {
    report.metric(&format!("{server}_ops_per_sec_{tag}"), r.ops_per_sec);
    report.metric(&format!("{server}_p50_us_{tag}"), r.p50_us);
    report.metric(&format!("{server}_p99_us_{tag}"), r.p99_us);
    report.metric(
        &format!("{server}_ops_per_cpu_sec_{tag}"),
        r.ops_per_cpu_sec(),
    );
}

/// The claims of one run: ours / Redis in ops/s and in operations per server CPU second
/// (`{server}_vs_redis_{tag}`, `{server}_vs_redis_per_cpu_{tag}`).
fn report_vs_redis(report: &mut Report, server: &str, tag: &str, ours: &Run, redis: &Run) {
    report.ratio(
        &format!("{server}_vs_redis_{tag}"),
        ours.ops_per_sec / redis.ops_per_sec,
    );
    report.ratio(
        &format!("{server}_vs_redis_per_cpu_{tag}"),
        ours.ops_per_cpu_sec() / redis.ops_per_cpu_sec(),
    );
}

pub(crate) fn run_batching(effort: Effort) -> Report {
    let ops = match effort {
        Effort::Full => 200_000usize,
        Effort::Quick => 2_000,
    };
    let mut report = Report::new("store-batching");
    report
        .param("ops", ops as u64)
        .param("batch", 100)
        .param("mix", "counter add");
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        shards: 1,
        ..Config::default()
    })
    .expect("start the store");
    let mut b = StoreConnector::new(server.local_addr().to_string())
        .open()
        .expect("connect");
    let key = ObjectKey::shared("bench", Kind::Counter, "batching");
    let op = SOp::Add {
        key: key.clone(),
        delta: 1,
    };
    let mut replies = Vec::new();
    // Single requests: one operation per frame, each waited for.
    let single_n = ops / 10;
    let t = Instant::now();
    for _ in 0..single_n {
        replies.clear();
        b.execute(std::slice::from_ref(&op), &mut replies)
            .expect("execute");
    }
    let single = t.elapsed().as_secs_f64() / single_n as f64;
    // Multi-op frames of 100.
    let batch: Vec<SOp> = (0..100).map(|_| op.clone()).collect();
    let t = Instant::now();
    for _ in 0..ops / 100 {
        replies.clear();
        b.execute(&batch, &mut replies).expect("execute");
    }
    let batched = t.elapsed().as_secs_f64() / (ops / 100 * 100) as f64;
    report.metric("single_cost_per_op_us", single * 1e6);
    report.metric("batch100_cost_per_op_us", batched * 1e6);
    report.ratio("single_vs_batch100_cost_per_op", single / batched);
    server.stop();
    report
}

/// The [`Run`] of `ops` operations in `wall` seconds with latencies `lat`.
fn summarize(lat: &mut [Duration], ops: usize, wall: f64, server_cpu_s: f64) -> Run {
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Run {
        ops,
        ops_per_sec: ops as f64 / wall,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        server_cpu_s,
    }
}

/// CPU seconds of the threads of process `pid` whose name starts with `prefix` (all with an
/// empty prefix), from each thread's `schedstat` (nanoseconds on the CPU, exact, where the
/// `stat` file's user and system times are sampled at clock ticks).
fn threads_cpu(pid: &str, prefix: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let mut ns = 0u64;
    for t in tasks.flatten() {
        let dir = t.path();
        let wanted = prefix.is_empty()
            || std::fs::read_to_string(dir.join("comm"))
                .is_ok_and(|c| c.trim_end().starts_with(prefix));
        if !wanted {
            continue;
        }
        ns += std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    ns as f64 / 1e9
}

/// CPU seconds of the in-process store's threads (named `store-*`: shard threads and the
/// accept thread).
fn store_threads_cpu() -> f64 {
    threads_cpu("self", "store-")
}

/// A `redis-server` started for the benchmark (persistence off), stopped when dropped.
struct Redis {
    child: Child,
    addr: SocketAddr,
    version: String,
}

impl Redis {
    fn start() -> Option<Redis> {
        let version = Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let args = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(str::to_owned);
        // One core for Redis when taskset is there.
        let pinned = Command::new("taskset")
            .args(["-c", "0", "redis-server"])
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match pinned {
            Ok(c) => c,
            Err(_) => Command::new("redis-server")
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok()?,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut r = Redis {
            child,
            addr,
            version,
        };
        for _ in 0..500 {
            if TcpStream::connect(addr).is_ok() {
                // taskset execs redis-server: the pid is Redis's own.
                return Some(r);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = r.child.kill();
        None
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs requests `0..ops` of the mix (after a warm-up) against our store at `addr` over
/// `connections` connections with `depth` requests in flight on each, as `store-ops` does,
/// `batched`: each window in one multi-op frame. The operations run and the store threads'
/// CPU seconds (for `examples/store_load`).
pub fn load_store(
    addr: SocketAddr,
    connections: usize,
    depth: usize,
    ops: usize,
    batched: bool,
) -> (usize, f64) {
    let reqs = Requests::new(Wire::Ours, ops, if batched { depth } else { 1 });
    let shape = Shape {
        connections,
        depth,
        ops,
        min_run: Duration::ZERO,
    };
    let run = measure(addr, &reqs, shape, &store_threads_cpu);
    (run.ops, run.server_cpu_s)
}

/// Operation `i` of the mix on our store: set, get, incr, list push, list pop in turn. Each
/// group of five works on one key (of 1,000) and one counter and list (of 10), so the get reads
/// what the set wrote and the pop takes what the push added: every operation finds its object.
/// (`Wire::Redis` sends the same mix as RESP commands.)
fn mix_op(i: usize) -> Op {
    let k = (i / 5) % 1000;
    match i % 5 {
        0 => Op::Set {
            key: format!("bench@Value@k{k}").into_bytes(),
            value: vec![b'v'; 16],
        },
        1 => Op::Get {
            key: format!("bench@Value@k{k}").into_bytes(),
        },
        2 => Op::Add {
            key: format!("bench@Counter@c{}", k % 10).into_bytes(),
            delta: 1,
        },
        3 => Op::Push {
            key: format!("bench@List@l{}", k % 10).into_bytes(),
            item: vec![b'i'; 8],
        },
        _ => Op::Pop {
            key: format!("bench@List@l{}", k % 10).into_bytes(),
        },
    }
}

/// The wire protocol of a server under test, and the operation mix in it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// Ours: one operation per batch frame.
    Ours,
    /// RESP, one command per request.
    Redis,
}

impl Wire {
    /// Appends requests `ops` of the mix ([`mix_op`]) to `out`: ours in one batch frame with
    /// request id `id`, Redis's as one command each (`ops` is then one request).
    fn request(self, ops: Range<usize>, id: u64, out: &mut Vec<u8>) {
        match self {
            Wire::Ours => {
                let start = proto::begin_batch(out, id, 0, false, ops.len() as u32);
                for i in ops {
                    proto::put_request(out, &mix_op(i), None, None);
                }
                proto::finish(out, start);
            }
            Wire::Redis => {
                for i in ops {
                    let k = (i / 5) % 1000;
                    match i % 5 {
                        0 => resp(out, &[b"SET", format!("k{k}").as_bytes(), &[b'v'; 16]]),
                        1 => resp(out, &[b"GET", format!("k{k}").as_bytes()]),
                        2 => resp(out, &[b"INCR", format!("c{}", k % 10).as_bytes()]),
                        3 => resp(
                            out,
                            &[b"RPUSH", format!("l{}", k % 10).as_bytes(), &[b'i'; 8]],
                        ),
                        _ => resp(out, &[b"LPOP", format!("l{}", k % 10).as_bytes()]),
                    }
                }
            }
        }
    }

    /// Length of the whole answer at the start of `buf`, if it is all there, and how many
    /// operations it answers. Panics on an error answer: the bench's requests are all valid.
    fn answer_len(self, buf: &[u8]) -> Option<(usize, usize)> {
        match self {
            Wire::Ours => {
                let h = proto::peek_header(buf, &Limits::default()).expect("store answer")?;
                assert_eq!(h.kind, Message::REPLIES, "store answer of kind {}", h.kind);
                let whole = buf.get(..h.total)?;
                // Replies body: reply count u32, then the replies.
                let count = whole
                    .get(proto::HEADER_LEN..proto::HEADER_LEN + 4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                Some((h.total, count.expect("a replies frame") as usize))
            }
            Wire::Redis => {
                let n = resp_reply_len(buf)?;
                assert_ne!(buf[0], b'-', "redis error");
                Some((n, 1))
            }
        }
    }
}

/// Length of one whole RESP reply at the start of `b`, if it is all there.
fn resp_reply_len(b: &[u8]) -> Option<usize> {
    let line = b.windows(2).position(|w| w == b"\r\n")?;
    match b.first()? {
        b'+' | b'-' | b':' => Some(line + 2),
        b'$' => {
            let n: i64 = std::str::from_utf8(&b[1..line]).ok()?.parse().ok()?;
            if n < 0 {
                return Some(line + 2);
            }
            let total = line + 2 + n as usize + 2;
            (b.len() >= total).then_some(total)
        }
        _ => panic!("unexpected redis reply {:?}", &b[..line]),
    }
}

/// Appends a RESP command.
fn resp(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// The mix's requests `0..n` on one wire, encoded before the clock starts: while it runs,
/// the client only writes these bytes and finds where each answer ends, so that one client
/// thread can keep a server core busy.
struct Requests {
    wire: Wire,
    /// Operations per frame: 1, or (ours only) a window's worth in one multi-op frame.
    per_frame: usize,
    bytes: Vec<u8>,
    /// `ends[i]`: where the frame of request `i` ends in `bytes`.
    ends: Vec<usize>,
}

impl Requests {
    fn new(wire: Wire, n: usize, per_frame: usize) -> Requests {
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(n);
        for first in (0..n).step_by(per_frame) {
            let ops = first..(first + per_frame).min(n);
            wire.request(ops.clone(), first as u64 + 1, &mut bytes);
            ends.extend(ops.map(|_| bytes.len()));
        }
        Requests {
            wire,
            per_frame,
            bytes,
            ends,
        }
    }

    /// Where requests `a..b` are in `bytes` (`a` starts a frame).
    fn span(&self, a: usize, b: usize) -> Range<usize> {
        let start = a.checked_sub(1).map_or(0, |p| self.ends[p]);
        start..self.ends[b - 1]
    }
}

/// One client connection of [`run_pipes`]: it runs requests `next..end` of the mix in
/// windows of `depth`, sending a window when the last one is all answered.
struct Pipe {
    s: mio::net::TcpStream,
    /// The part of the window in flight not yet written (a span of [`Requests::bytes`]).
    unsent: Range<usize>,
    /// Answers read, `..filled` of it, not yet taken.
    buf: Vec<u8>,
    filled: usize,
    next: usize,
    end: usize,
    /// Answers still expected for the window in flight, and when it was sent.
    waiting: usize,
    sent: Instant,
}

impl Pipe {
    fn connect(addr: SocketAddr) -> Pipe {
        let s = TcpStream::connect(addr).expect("connect to the server");
        let _ = s.set_nodelay(true);
        s.set_nonblocking(true).expect("non-blocking socket");
        Pipe {
            s: mio::net::TcpStream::from_std(s),
            unsent: 0..0,
            buf: vec![0; 1 << 16],
            filled: 0,
            next: 0,
            end: 0,
            waiting: 0,
            sent: Instant::now(),
        }
    }

    /// Sends the next window if the last one is answered; whether requests remain.
    fn refill(&mut self, reqs: &Requests, depth: usize) -> bool {
        if self.waiting == 0 && self.next < self.end {
            let n = depth.min(self.end - self.next);
            self.unsent = reqs.span(self.next, self.next + n);
            self.next += n;
            self.waiting = n;
            self.sent = Instant::now();
            self.write(reqs);
        }
        self.waiting > 0 || self.next < self.end
    }

    /// Writes what the socket takes of the window.
    fn write(&mut self, reqs: &Requests) {
        while !self.unsent.is_empty() {
            match self.s.write(&reqs.bytes[self.unsent.clone()]) {
                Ok(n) => self.unsent.start += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("write: {e}"),
            }
        }
    }

    /// Reads what came and takes each whole answer; the answers of one read get one latency,
    /// the time since their window was sent, in `lat`.
    fn read(&mut self, wire: Wire, lat: &mut Vec<Duration>) {
        loop {
            let room = self.buf.len() - self.filled;
            let n = match self.s.read(&mut self.buf[self.filled..]) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("read: {e}"),
            };
            self.filled += n;
            let waited = self.sent.elapsed();
            let mut taken = 0;
            while let Some((len, ops)) = wire.answer_len(&self.buf[taken..self.filled]) {
                taken += len;
                self.waiting = self.waiting.checked_sub(ops).expect("unasked answers");
                lat.extend(std::iter::repeat_n(waited, ops));
            }
            self.buf.copy_within(taken..self.filled, 0);
            self.filled -= taken;
            // A TCP read shorter than the room left has emptied the socket: the next byte
            // will be a new readiness event.
            if n < room {
                return;
            }
            if self.filled == self.buf.len() {
                let grown = 2 * self.buf.len();
                self.buf.resize(grown, 0);
            }
        }
    }
}

/// Runs requests `0..ops` of `reqs` over `pipes` (a contiguous share each), each with a window
/// of `depth` requests in flight, from this thread's own event loop; appends their latencies
/// to `lat`.
fn run_pipes(
    pipes: &mut [Pipe],
    poll: &mut mio::Poll,
    reqs: &Requests,
    depth: usize,
    ops: usize,
    lat: &mut Vec<Duration>,
) {
    // Shares (and so windows) start on frame boundaries.
    let per = ops.div_ceil(pipes.len()).next_multiple_of(reqs.per_frame);
    for (c, p) in pipes.iter_mut().enumerate() {
        p.next = (c * per).min(ops);
        p.end = ((c + 1) * per).min(ops);
    }
    lat.reserve(ops);
    let mut events = mio::Events::with_capacity(64);
    loop {
        let mut busy = false;
        for p in pipes.iter_mut() {
            busy |= p.refill(reqs, depth);
        }
        if !busy {
            return;
        }
        if let Err(e) = poll.poll(&mut events, None) {
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
        }
        for ev in events.iter() {
            let Some(p) = pipes.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_writable() {
                p.write(reqs);
            }
            if ev.is_readable() {
                p.read(reqs.wire, lat);
            }
        }
    }
}

/// What one run sends.
#[derive(Clone, Copy)]
struct Shape {
    connections: usize,
    /// Requests in flight on each connection.
    depth: usize,
    /// Requests of one round.
    ops: usize,
    /// Rounds go on until this much time has passed.
    min_run: Duration,
}

/// One run against the server at `addr`: rounds of requests `0..ops` of `reqs` over
/// `connections` connections with `depth` requests in flight on each, until `min_run` has
/// passed, after a warm-up of a tenth of a round (which fills the keys; lists never run dry,
/// as push comes before pop in the mix). The client thread runs on the last CPU when there
/// are several (the servers are on CPU 0); `cpu` reads the server's CPU seconds.
fn measure(addr: SocketAddr, reqs: &Requests, shape: Shape, cpu: &(dyn Fn() -> f64 + Sync)) -> Run {
    let Shape {
        connections,
        depth,
        ops,
        min_run,
    } = shape;
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(&last) = core_affinity::get_core_ids()
                .unwrap_or_default()
                .get(1..)
                .and_then(<[_]>::last)
            {
                core_affinity::set_for_current(last);
            }
            let mut poll = mio::Poll::new().expect("poll");
            let mut pipes: Vec<Pipe> = (0..connections)
                .map(|c| {
                    let mut p = Pipe::connect(addr);
                    poll.registry()
                        .register(
                            &mut p.s,
                            mio::Token(c),
                            mio::Interest::READABLE | mio::Interest::WRITABLE,
                        )
                        .expect("register");
                    p
                })
                .collect();
            let warm_up = (ops / 10).max(depth).next_multiple_of(reqs.per_frame);
            let mut lat = Vec::with_capacity(ops);
            run_pipes(
                &mut pipes,
                &mut poll,
                reqs,
                depth,
                warm_up.min(ops),
                &mut lat,
            );
            lat.clear();
            let cpu0 = cpu();
            let t0 = Instant::now();
            let mut rounds = 0;
            while rounds == 0 || t0.elapsed() < min_run {
                run_pipes(&mut pipes, &mut poll, reqs, depth, ops, &mut lat);
                rounds += 1;
            }
            let wall = t0.elapsed().as_secs_f64();
            let server_cpu_s = cpu() - cpu0;
            summarize(&mut lat, rounds * ops, wall, server_cpu_s)
        })
        .join()
        .expect("the client thread")
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_ratios_compare_operations_per_cpu_second_of_runs_of_any_length() {
        let run = |ops, secs, cpu| summarize(&mut [], ops, secs, cpu);
        let mut report = Report::new("t");
        // Ours: twice the operations (more rounds) on the same CPU time, in half the time.
        report_vs_redis(
            &mut report,
            "store",
            "x",
            &run(600, 1.0, 0.5),
            &run(300, 2.0, 0.5),
        );
        assert_eq!(report.ratios["store_vs_redis_per_cpu_x"], 2.0);
        assert_eq!(report.ratios["store_vs_redis_x"], 4.0);
    }

    #[test]
    fn resp_reply_lengths() {
        assert_eq!(resp_reply_len(b"+OK\r\n+"), Some(5));
        assert_eq!(resp_reply_len(b":12\r\n"), Some(5));
        assert_eq!(resp_reply_len(b"$-1\r\n"), Some(5));
        assert_eq!(resp_reply_len(b"$3\r\nabc\r\n"), Some(9));
        assert_eq!(resp_reply_len(b"$3\r\nab"), None);
        assert_eq!(resp_reply_len(b":1"), None);
    }

    #[test]
    fn windows_in_one_frame_carry_the_mix_and_their_answers_count_every_operation() {
        let reqs = Requests::new(Wire::Ours, 10, 4);
        // Frames of 4, 4 and 2 operations; a window starting on a frame is whole frames.
        let mut rest = &reqs.bytes[reqs.span(4, 10)];
        for (first, n) in [(4, 4), (8, 2)] {
            let (frame, used) = proto::decode(rest, &Limits::default()).unwrap().unwrap();
            assert_eq!(frame.id, first as u64 + 1);
            let Message::Batch { ops, .. } = frame.msg else {
                panic!("{:?}", frame.msg)
            };
            let want: Vec<Op> = (first..first + n).map(mix_op).collect();
            assert_eq!(ops.into_iter().map(|r| r.op).collect::<Vec<_>>(), want);
            rest = &rest[used..];
        }
        assert!(rest.is_empty());
        let mut answer = Vec::new();
        proto::encode(
            &proto::Frame {
                id: 5,
                msg: Message::Replies(vec![proto::Reply::Done, proto::Reply::Int(3)]),
            },
            &mut answer,
        );
        assert_eq!(Wire::Ours.answer_len(&answer), Some((answer.len(), 2)));
        assert_eq!(Wire::Ours.answer_len(&answer[..answer.len() - 1]), None);
    }

    #[test]
    fn quick_runs_report_the_contract_names() {
        let r = run_ops(Effort::Quick);
        for d in [1, 16, 64] {
            assert!(r.metrics[&format!("store_ops_per_sec_depth{d}")] > 0.0);
        }
        assert!(r.ratios.contains_key("store_depth64_vs_depth1"));
        for (c, d) in RUNS.into_iter().filter(|&(c, _)| c > 1) {
            assert!(r.metrics[&format!("store_ops_per_sec_depth{d}_clients{c}")] > 0.0);
        }
        assert!(r.metrics["store_batched_ops_per_sec_depth64_clients64"] > 0.0);
        let b = run_batching(Effort::Quick);
        assert!(b.ratios["single_vs_batch100_cost_per_op"] > 0.0);
    }
}
