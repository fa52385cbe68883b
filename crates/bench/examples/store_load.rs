//! A load on a one-shard store for profiling, from the client of `flowstate bench store-ops`
//! (its mix, its pre-encoded requests): `cargo run --release -p flowstate-bench --example
//! store_load -- <connections> <depth> <seconds> [batched]` (`batched`: each window of `depth`
//! requests in one multi-op frame). Prints the store threads' user and system
//! CPU time and their CPU time per operation.

use flowstate_bench::store_ops::load_store;
use flowstate_store::{Config, Server};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: u64| args.next().and_then(|a| a.parse().ok()).unwrap_or(default);
    let (connections, depth, secs) = (arg(1) as usize, arg(64) as usize, arg(10));
    let batched = std::env::args().nth(4).as_deref() == Some("batched");
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 1,
        cpus: vec![0],
        ..Config::default()
    })
    .unwrap();
    let (mut ops, mut cpu_s) = (0usize, 0.0);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        let (n, cpu) = load_store(server.local_addr(), connections, depth, 200_000, batched);
        ops += n;
        cpu_s += cpu;
    }
    let (user, system) = store_user_system();
    println!("store threads since start: user {user:.2} s, system {system:.2} s");
    println!(
        "{:.0} ops/s, {:.0} ns of store CPU per op",
        ops as f64 / t0.elapsed().as_secs_f64(),
        cpu_s * 1e9 / ops as f64
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
