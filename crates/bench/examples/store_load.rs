//! A pipelining load on a one-shard store, for profiling: `cargo run --release --example
//! store_load -p flowstate-bench -- <depth> <seconds> [churn|store-ops]`. The `churn` mix (the default)
//! pushes to a missing list and pops it empty, so one operation in five creates an object;
//! `store-ops` is the mix of `flowstate bench store-ops`.

use flowstate_bench::store_ops::{mix_op, store_threads_cpu};
use flowstate_proto::{self as proto, Frame, Limits, Message, Op, Request};
use flowstate_store::{Config, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let depth: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let bench_mix = args.next().as_deref() == Some("store-ops");
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 1,
        cpus: vec![0],
        ..Config::default()
    })
    .unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let cpu0 = store_threads_cpu();
    let t0 = Instant::now();
    let mut ops = 0u64;
    let mut i = 0usize;
    while t0.elapsed() < Duration::from_secs(secs) {
        out.clear();
        for _ in 0..depth {
            let key = format!("key:{}", i % 1000).into_bytes();
            let op = if bench_mix {
                mix_op(i)
            } else {
                match i % 5 {
                    0 => Op::Set {
                        key,
                        value: b"value-0123456789".to_vec(),
                    },
                    1 => Op::Get { key },
                    2 => Op::Add {
                        key: format!("ctr:{}", i % 1000).into_bytes(),
                        delta: 1,
                    },
                    3 => Op::Push {
                        key: format!("list:{}", i % 1000).into_bytes(),
                        item: b"item".to_vec(),
                    },
                    _ => Op::Pop {
                        key: format!("list:{}", (i - 1) % 1000).into_bytes(),
                    },
                }
            };
            i += 1;
            proto::encode(
                &Frame {
                    id: i as u64,
                    msg: Message::Batch {
                        op_id: 0,
                        ack_only: false,
                        ops: vec![Request::from(op)],
                    },
                },
                &mut out,
            );
        }
        s.write_all(&out).unwrap();
        let mut got = 0;
        while got < depth {
            while let Ok(Some((_, used))) = proto::decode(&buf, &Limits::default()) {
                buf.drain(..used);
                got += 1;
            }
            if got == depth {
                break;
            }
            let n = s.read(&mut chunk).unwrap();
            buf.extend_from_slice(&chunk[..n]);
        }
        ops += depth as u64;
    }
    let cpu_ns = (store_threads_cpu() - cpu0) * 1e9;
    let (user, system) = store_user_system();
    println!("store threads since start: user {user:.2} s, system {system:.2} s");
    println!(
        "{:.0} ops/s, {:.0} ns of store CPU per op",
        ops as f64 / t0.elapsed().as_secs_f64(),
        cpu_ns / ops as f64
    );
    server.stop();
}

/// User and system CPU seconds of the store's threads since they started (`stat`).
fn store_user_system() -> (f64, f64) {
    let (mut u, mut s) = (0.0, 0.0);
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("store-") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
        u += ticks(11) / 100.0;
        s += ticks(12) / 100.0;
    }
    (u, s)
}
