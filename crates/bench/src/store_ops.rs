//! The state store's own benchmarks (issue 4; CHC §7.1 "Datastore performance", StatelessNF
//! §5.3 batching):
//!
//! * `store-ops`: our store (`flowstate-store`, one shard thread, pinned to CPU 0) against a
//!   real `redis-server` (persistence off, pinned to CPU 0 with `taskset` when there is
//!   one), the same operation mix (set, get, incr, list push, list pop) from one client
//!   connection at pipeline depths 1, 16 and 64: ops/s, p50/p99 latency, and ops per second
//!   of server CPU time, with the ratios ours/Redis. Server CPU time is measured the same way
//!   for both, from each thread's `/proc/<pid>/task/<tid>/schedstat`: all of Redis's threads,
//!   and our store's own threads (`store-*`; the client thread in the same process is not
//!   counted). Redis is skipped (and its ratios left out) when `redis-server` is not on the
//!   PATH. Beside the one-connection runs, an extra run at depths 16 and 64 spreads the same
//!   operations over [`CLIENTS`] connections driven by one client thread with its own event
//!   loop (each connection keeps its own window of `depth` requests in flight): the keys end
//!   in `_clients4`; Redis gets exactly the same load.
//! * `store-batching`: the effective per-operation cost through the `store` driver of single
//!   requests against multi-op frames of 100 operations.

use crate::{Effort, Report};
use flowstate_driver_store::StoreConnector;
use flowstate_proto::{self as proto, Frame, Limits, Message, Op};
use flowstate_state::{Backend, Kind, ObjectKey, Op as SOp};
use flowstate_store::{Config, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEPTHS: [usize; 3] = [1, 16, 64];
/// Client connections of the extra runs (keys `..._depthN_clients4`).
const CLIENTS: usize = 4;
/// Depths of the extra runs.
const CLIENT_DEPTHS: [usize; 2] = [16, 64];

/// Latency and rate of one run.
struct Run {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Server CPU seconds used during the run.
    server_cpu_s: f64,
}

pub(crate) fn run_ops(effort: Effort) -> Report {
    let ops = match effort {
        Effort::Full => 300_000usize,
        Effort::Quick => 3_000,
    };
    let mut report = Report::new("store-ops");
    report
        .param("ops_per_depth", ops as u64)
        .param("mix", "set, get, incr, list push, list pop (equal shares)")
        .param("store_shards", 1)
        .param("store_cpu", 0)
        .param("client_connections", 1)
        .param("extra_client_connections", CLIENTS as u64);
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
    let mut ours = Vec::new();
    for depth in DEPTHS {
        let r = measure(
            &mut Ours::connect(server.local_addr()),
            depth,
            ops,
            &store_threads_cpu,
        );
        let tag = format!("depth{depth}");
        report_run(&mut report, "store", &tag, &r, ops);
        if let Some(redis) = &redis {
            let pid = redis.child.id();
            let rr = measure(&mut RedisConn::connect(redis.addr), depth, ops, &|| {
                threads_cpu(&pid.to_string(), "")
            });
            report_run(&mut report, "redis", &tag, &rr, ops);
            report_vs_redis(&mut report, &tag, &r, &rr);
        }
        ours.push(r.ops_per_sec);
    }
    report.ratio("store_depth64_vs_depth1", ours[2] / ours[0]);
    report.ratio("store_depth16_vs_depth1", ours[1] / ours[0]);
    for depth in CLIENT_DEPTHS {
        let tag = format!("depth{depth}_clients{CLIENTS}");
        let r = measure_clients(
            server.local_addr(),
            Wire::Ours,
            depth,
            ops,
            &store_threads_cpu,
        );
        report_run(&mut report, "store", &tag, &r, ops);
        if let Some(redis) = &redis {
            let pid = redis.child.id();
            let rr = measure_clients(redis.addr, Wire::Redis, depth, ops, &|| {
                threads_cpu(&pid.to_string(), "")
            });
            report_run(&mut report, "redis", &tag, &rr, ops);
            report_vs_redis(&mut report, &tag, &r, &rr);
        }
    }
    drop(redis);
    server.stop();
    report
}

/// Reports a run's metrics as `<server>_<name>_<tag>`.
fn report_run(report: &mut Report, server: &str, tag: &str, r: &Run, ops: usize) {
    report.metric(&format!("{server}_ops_per_sec_{tag}"), r.ops_per_sec);
    report.metric(&format!("{server}_p50_us_{tag}"), r.p50_us);
    report.metric(&format!("{server}_p99_us_{tag}"), r.p99_us);
    report.metric(
        &format!("{server}_ops_per_cpu_sec_{tag}"),
        ops as f64 / r.server_cpu_s.max(1e-3),
    );
}

/// The claims of one run: ours / Redis in ops/s and in operations per server CPU second
/// (`store_vs_redis_{tag}`, `store_vs_redis_per_cpu_{tag}`).
fn report_vs_redis(report: &mut Report, tag: &str, ours: &Run, redis: &Run) {
    report.ratio(
        &format!("store_vs_redis_{tag}"),
        ours.ops_per_sec / redis.ops_per_sec,
    );
    report.ratio(
        &format!("store_vs_redis_per_cpu_{tag}"),
        redis.server_cpu_s.max(1e-3) / ours.server_cpu_s.max(1e-3),
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

/// A pipelined client of some server.
trait Client {
    /// Appends request `i` of the mix to the pending window.
    fn push(&mut self, i: usize);
    /// Sends the window.
    fn flush(&mut self);
    /// Waits for the next answer.
    fn next_answer(&mut self);
}

fn measure(c: &mut dyn Client, depth: usize, ops: usize, cpu: &dyn Fn() -> f64) -> Run {
    // Warm up (fills the keys, lists never run dry: push comes before pop in the mix).
    for i in 0..(ops / 10).max(depth) {
        c.push(i);
    }
    c.flush();
    for _ in 0..(ops / 10).max(depth) {
        c.next_answer();
    }
    let mut lat = Vec::with_capacity(ops);
    let cpu0 = cpu();
    let t0 = Instant::now();
    let mut i = 0;
    while i < ops {
        let n = depth.min(ops - i);
        for j in 0..n {
            c.push(i + j);
        }
        let sent = Instant::now();
        c.flush();
        for _ in 0..n {
            c.next_answer();
            lat.push(sent.elapsed());
        }
        i += n;
    }
    let wall = t0.elapsed().as_secs_f64();
    let server_cpu_s = cpu() - cpu0;
    summarize(&mut lat, ops, wall, server_cpu_s)
}

/// The [`Run`] of `ops` operations in `wall` seconds with latencies `lat`.
fn summarize(lat: &mut [Duration], ops: usize, wall: f64, server_cpu_s: f64) -> Run {
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Run {
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
pub fn store_threads_cpu() -> f64 {
    threads_cpu("self", "store-")
}

/// A raw protocol client of our store: one operation per frame, as Redis gets one command
/// per request.
struct Ours {
    s: TcpStream,
    out: Vec<u8>,
    buf: Vec<u8>,
    start: usize,
    id: u64,
}

impl Ours {
    fn connect(addr: SocketAddr) -> Ours {
        let s = TcpStream::connect(addr).expect("connect to the store");
        let _ = s.set_nodelay(true);
        Ours {
            s,
            out: Vec::new(),
            buf: Vec::with_capacity(1 << 16),
            start: 0,
            id: 0,
        }
    }
}

impl Client for Ours {
    fn push(&mut self, i: usize) {
        self.id += 1;
        Wire::Ours.request(i, self.id, &mut self.out);
    }

    fn flush(&mut self) {
        self.s.write_all(&self.out).expect("write to the store");
        self.out.clear();
    }

    fn next_answer(&mut self) {
        loop {
            if let Some(used) = Wire::Ours.answer_len(&self.buf[self.start..]) {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return;
            }
            let mut chunk = [0u8; 65536];
            let n = self.s.read(&mut chunk).expect("read from the store");
            assert!(n > 0, "the store closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
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

/// A pipelining RESP client.
struct RedisConn {
    s: TcpStream,
    out: Vec<u8>,
    buf: Vec<u8>,
    start: usize,
}

impl RedisConn {
    fn connect(addr: SocketAddr) -> RedisConn {
        let s = TcpStream::connect(addr).expect("connect to redis");
        let _ = s.set_nodelay(true);
        RedisConn {
            s,
            out: Vec::new(),
            buf: Vec::with_capacity(1 << 16),
            start: 0,
        }
    }

    /// Length of one whole RESP reply at the start of `b`, if it is all there.
    fn reply_len(b: &[u8]) -> Option<usize> {
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
}

impl Client for RedisConn {
    fn push(&mut self, i: usize) {
        Wire::Redis.request(i, 0, &mut self.out);
    }

    fn flush(&mut self) {
        self.s.write_all(&self.out).expect("write to redis");
        self.out.clear();
    }

    fn next_answer(&mut self) {
        loop {
            if let Some(n) = Wire::Redis.answer_len(&self.buf[self.start..]) {
                self.start += n;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return;
            }
            let mut chunk = [0u8; 65536];
            let n = self.s.read(&mut chunk).expect("read from redis");
            assert!(n > 0, "redis closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Operation `i` of the mix on our store: set, get, incr, list push, list pop in turn. Each
/// group of five works on one key (of 1,000) and one counter and list (of 10), so the get reads
/// what the set wrote and the pop takes what the push added: every operation finds its object.
/// (`Wire::Redis` sends the same mix as RESP commands.)
pub fn mix_op(i: usize) -> Op {
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
    /// Appends request `i` of the mix ([`mix_op`]) to `out`; `id` is the frame's request id
    /// (ours only).
    fn request(self, i: usize, id: u64, out: &mut Vec<u8>) {
        let k = (i / 5) % 1000;
        match self {
            Wire::Ours => {
                let op = mix_op(i);
                let start = proto::begin_batch(out, id, 0, false, 1);
                proto::put_request(out, &op, None, None);
                proto::finish(out, start);
            }
            Wire::Redis => match i % 5 {
                0 => resp(out, &[b"SET", format!("k{k}").as_bytes(), &[b'v'; 16]]),
                1 => resp(out, &[b"GET", format!("k{k}").as_bytes()]),
                2 => resp(out, &[b"INCR", format!("c{}", k % 10).as_bytes()]),
                3 => resp(
                    out,
                    &[b"RPUSH", format!("l{}", k % 10).as_bytes(), &[b'i'; 8]],
                ),
                _ => resp(out, &[b"LPOP", format!("l{}", k % 10).as_bytes()]),
            },
        }
    }

    /// Length of the whole answer at the start of `buf`, if it is all there. Panics on an
    /// error answer: the bench's requests are all valid.
    fn answer_len(self, buf: &[u8]) -> Option<usize> {
        match self {
            Wire::Ours => match proto::decode(buf, &Limits::default()) {
                Ok(Some((Frame { msg, .. }, used))) => {
                    assert!(matches!(msg, Message::Replies(_)), "{msg:?}");
                    Some(used)
                }
                Ok(None) => None,
                Err(e) => panic!("store answer: {e}"),
            },
            Wire::Redis => {
                let n = RedisConn::reply_len(buf)?;
                assert_ne!(buf[0], b'-', "redis error");
                Some(n)
            }
        }
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

/// One of several pipelined connections of [`measure_clients`]: it runs requests
/// `next..end` of the mix in windows of `depth`.
struct Pipe {
    s: mio::net::TcpStream,
    out: Vec<u8>,
    sent_to: usize,
    buf: Vec<u8>,
    start: usize,
    next: usize,
    end: usize,
    /// Answers still expected for the window in flight, and when it was sent.
    waiting: usize,
    sent: Instant,
    id: u64,
}

impl Pipe {
    /// Sends the next window if the last one is answered; whether requests remain.
    fn refill(&mut self, wire: Wire, depth: usize) -> bool {
        if self.waiting == 0 && self.next < self.end {
            let n = depth.min(self.end - self.next);
            for i in self.next..self.next + n {
                self.id += 1;
                wire.request(i, self.id, &mut self.out);
            }
            self.next += n;
            self.waiting = n;
            self.sent = Instant::now();
            self.write();
        }
        self.waiting > 0 || self.next < self.end
    }

    /// Writes what the socket takes.
    fn write(&mut self) {
        while self.sent_to < self.out.len() {
            match self.s.write(&self.out[self.sent_to..]) {
                Ok(n) => self.sent_to += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("write: {e}"),
            }
        }
        self.out.clear();
        self.sent_to = 0;
    }

    /// Reads what came and takes each whole answer, noting its latency in `lat`.
    fn read(&mut self, wire: Wire, lat: &mut Vec<Duration>) {
        let mut chunk = [0u8; 65536];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        while let Some(n) = wire.answer_len(&self.buf[self.start..]) {
            self.start += n;
            self.waiting = self.waiting.saturating_sub(1);
            lat.push(self.sent.elapsed());
        }
        self.buf.drain(..self.start);
        self.start = 0;
    }
}

/// Runs requests `0..ops` of the mix over [`CLIENTS`] connections (a contiguous share each),
/// each with a window of `depth` requests in flight, from this thread's own event loop.
fn run_pipes(
    pipes: &mut [Pipe],
    poll: &mut mio::Poll,
    wire: Wire,
    depth: usize,
    ops: usize,
) -> Vec<Duration> {
    let per = ops.div_ceil(pipes.len());
    for (c, p) in pipes.iter_mut().enumerate() {
        p.next = (c * per).min(ops);
        p.end = ((c + 1) * per).min(ops);
    }
    let mut lat = Vec::with_capacity(ops);
    let mut events = mio::Events::with_capacity(64);
    loop {
        let mut busy = false;
        for p in pipes.iter_mut() {
            busy |= p.refill(wire, depth);
        }
        if !busy {
            return lat;
        }
        if let Err(e) = poll.poll(&mut events, None) {
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
        }
        for ev in events.iter() {
            let Some(p) = pipes.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_writable() {
                p.write();
            }
            if ev.is_readable() {
                p.read(wire, &mut lat);
            }
        }
    }
}

/// [`measure`] over [`CLIENTS`] connections to `addr`: the same operations, the same
/// warm-up, the same server CPU accounting.
fn measure_clients(
    addr: SocketAddr,
    wire: Wire,
    depth: usize,
    ops: usize,
    cpu: &dyn Fn() -> f64,
) -> Run {
    let mut poll = mio::Poll::new().expect("poll");
    let mut pipes: Vec<Pipe> = (0..CLIENTS)
        .map(|c| {
            let s = TcpStream::connect(addr).expect("connect");
            let _ = s.set_nodelay(true);
            s.set_nonblocking(true).expect("non-blocking socket");
            let mut s = mio::net::TcpStream::from_std(s);
            poll.registry()
                .register(
                    &mut s,
                    mio::Token(c),
                    mio::Interest::READABLE | mio::Interest::WRITABLE,
                )
                .expect("register");
            Pipe {
                s,
                out: Vec::new(),
                sent_to: 0,
                buf: Vec::with_capacity(1 << 16),
                start: 0,
                next: 0,
                end: 0,
                waiting: 0,
                sent: Instant::now(),
                id: 0,
            }
        })
        .collect();
    // Warm up as `measure` does.
    run_pipes(&mut pipes, &mut poll, wire, depth, (ops / 10).max(depth));
    let cpu0 = cpu();
    let t0 = Instant::now();
    let mut lat = run_pipes(&mut pipes, &mut poll, wire, depth, ops);
    let wall = t0.elapsed().as_secs_f64();
    let server_cpu_s = cpu() - cpu0;
    summarize(&mut lat, ops, wall, server_cpu_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_reply_lengths() {
        assert_eq!(RedisConn::reply_len(b"+OK\r\n+"), Some(5));
        assert_eq!(RedisConn::reply_len(b":12\r\n"), Some(5));
        assert_eq!(RedisConn::reply_len(b"$-1\r\n"), Some(5));
        assert_eq!(RedisConn::reply_len(b"$3\r\nabc\r\n"), Some(9));
        assert_eq!(RedisConn::reply_len(b"$3\r\nab"), None);
        assert_eq!(RedisConn::reply_len(b":1"), None);
    }

    #[test]
    fn quick_runs_report_the_contract_names() {
        let r = run_ops(Effort::Quick);
        for d in DEPTHS {
            assert!(r.metrics[&format!("store_ops_per_sec_depth{d}")] > 0.0);
        }
        assert!(r.ratios.contains_key("store_depth64_vs_depth1"));
        for d in CLIENT_DEPTHS {
            assert!(r.metrics[&format!("store_ops_per_sec_depth{d}_clients{CLIENTS}")] > 0.0);
        }
        let b = run_batching(Effort::Quick);
        assert!(b.ratios["single_vs_batch100_cost_per_op"] > 0.0);
    }
}
