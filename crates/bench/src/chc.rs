//! CHC's correctness experiments (§7.1, §7.3) that run in one process or on one store:
//!
//! * **Per-packet overhead of externalized state** (§7.1, Fig. 8): the NAT on 1,000
//!   established UDP flows, each packet timed alone: `t` traditional (its state in the
//!   process: the embedded store, whose cache is the only copy); `eo` externalized to our
//!   store over loopback with no cache (`StateConfig::uncached`: every read a round trip, the
//!   packet's changes sent without waiting); `c` cached, every packet's changes sent and
//!   acknowledged before the next (one round trip a packet); and `na` cached without waiting:
//!   changes flushed every 1 ms in the background (flowstate's default).
//!   `metrics.overhead_us_p50_{t,eo,c,na}` and
//!   `ratios.na_vs_t_overhead_us`, the median µs `na` adds to `t` (CHC: +0.54 µs for its
//!   NAT); `overhead_us_mean_{t,na}` include `na`'s background flushes, which the median
//!   hides.
//! * **R6 in the lab** (needs root; skipped with `params.lab` saying so otherwise): a
//!   3-instance cluster (firewall → NAT, 16 partitions, every packet through the instances)
//!   carries a numbered one-way UDP stream of 32 flows at 4,000 datagrams a second, and one
//!   instance is killed (`kill -9`) a second in, with the root's packet log (`with`) and
//!   without it (`log_packets = 0`): `metrics.nf_lost_{with,without}_log`,
//!   `nf_duplicates_{with,without}_log` (datagrams the server got twice), `nf_replayed`, and
//!   `metrics.nf_recovery_ms`, how much longer than the median the worst-hit datagram took
//!   to arrive (failure detection, the survivors' claims, the replay; CHC Fig. 13), of which
//!   `nf_claim_ms_p50` is the claims' part. Then the
//!   root is killed under a second stream and `cluster up` starts a new one:
//!   `metrics.root_recovery_ms` is the new root's time from its start to every partition's
//!   owner ready (its `ready_ms`), `root_gap_ms` the longest silence at the server and
//!   `root_lost` the datagrams that arrived while no root ran (nothing buffers them).
//!   **R5, a straggler**: instance 1 of a cluster with `straggler = "40ms"` and 5 missed
//!   reports runs 20 ms in every 120 under the stream: `metrics.straggler_detected` (the
//!   controller failed it over as a straggler), `straggler_lost`, `straggler_replayed`,
//!   `duplicate_outputs_with_suppression` (datagrams the server got twice) and
//!   `duplicate_outputs_without_suppression` (the straggler's late outputs and notices the
//!   root dropped: what would have gone downstream without it; CHC Table 5).
//! * **R4, chain-wide ordering** (§7.3, W1–W3): the trojan trace (`gen --profile trojan`,
//!   110 inside hosts, 11 infected) goes through per-protocol scrubbers upstream of the trojan
//!   detector (SSH, FTP and IRC connections each through their own), with a host's three
//!   steps 50 µs apart (CHC planted its signatures into a 9.4 Gbps trace). In W1 the SSH
//!   scrubber adds a random 50–100 µs to every packet, in W2 the SSH and FTP ones, in W3 all
//!   three; a scrubber keeps each flow's packets in order (a flow is one thread's). The
//!   detector sees the packets in the order they leave the scrubbers, once with the root's
//!   logical clocks (the packets' original order) and once without (arrival order, as
//!   OpenNF): `metrics.trojans_found_with_clocks_w{1,2,3}`, `..._without_clocks_w{1,2,3}`,
//!   the false alerts of each, and the worst case over W1–W3 as
//!   `metrics.trojans_found_with_clocks` / `..._without_clocks` (CHC: 11/11 with clocks;
//!   OpenNF finds 4, 1, 0).
//! * **Offloaded operations vs lock–read–modify–write** (§7.1): two NAT-like workers update
//!   the same two shared counters (CHC's NAT: available ports and a packet counter) in our
//!   store over loopback, one packet at a time: offloaded, both increments go to the store in
//!   one request (one round trip; the store applies them), or naively, the worker takes the
//!   store's lock, reads both, writes both back and unlocks (three round trips and the wait
//!   for the other worker's lock). `metrics.{offload,lock_rw}_us_p50` per packet,
//!   `ratios.offload_vs_lock_rw` = the lock-RW median over the offload median (CHC: 2.17×),
//!   and the aggregate rates; both end with exactly one increment per packet (checked).
//! * **Store recovery** (§5.4, Fig. 14): our store (`flowstate store`, a process) with a data
//!   directory takes offloaded increments of shared counters from 5 and 10 writers (writers
//!   `w` and `w + 5` share their objects), is killed (`kill -9`) after a second, and is started
//!   again on its directory, at checkpoints every 30, 75 and 150 ms:
//!   `metrics.store_recovery_ms_{5,10}w_{30,75,150}ms` is the store's own time rebuilding its
//!   state from checkpoint and log (`recovery_us` of its stats; `store_recovery_ms` for 10
//!   writers at 150 ms, CHC's 388 ms), `store_restart_ms_...` the time until the new process
//!   answered minus an empty store's start-up, `store_recovered_records_...` the log records
//!   replayed. Every recovered counter holds at least every increment the store acknowledged
//!   (`store_recovery_complete`).

use crate::{Effort, Report};
use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, Source};
use flowstate_nf::trojan::{Config as TrojanConfig, Trojan};
use flowstate_nf::{Context, Direction, NetworkFunction, Packet};
use flowstate_state::local::LocalStore;
use flowstate_state::{Connector, Kind, ObjectKey, Op, Partition, Reply, StateConfig};
use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn run(effort: Effort) -> Report {
    let mut report = Report::new("chc");
    overheads(&mut report, effort);
    trojans(&mut report);
    offload_vs_lock(&mut report, effort);
    store_recovery(&mut report, effort);
    #[cfg(target_os = "linux")]
    lab::run(&mut report, effort);
    report
}

/// Our store, in this process on a free loopback port, and a connector to it; `None` (the
/// reason in `params.<part>_error`) when it does not start.
pub(crate) fn loopback_store(
    report: &mut Report,
    part: &str,
) -> Option<(
    flowstate_store::Server,
    flowstate_driver_store::StoreConnector,
)> {
    let started = flowstate_store::Server::start(flowstate_store::Config {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        ..flowstate_store::Config::default()
    });
    match started {
        Ok(server) => {
            let c = flowstate_driver_store::StoreConnector::new(server.local_addr().to_string());
            Some((server, c))
        }
        Err(e) => {
            report.param(&format!("{part}_error"), e.to_string());
            None
        }
    }
}

// ------------------------------------------------------------------------------------------
// §7.1, Fig. 8: what externalized state adds per packet

/// How a model uses the store.
#[derive(Clone, Copy, PartialEq)]
enum Model {
    /// No cache: every read a round trip, every packet's changes sent without waiting (`eo`).
    Uncached,
    /// Cached; every packet's changes acknowledged before the next packet (`c`).
    Each,
    /// Cached; changes flushed every 1 ms without waiting (`t` on the embedded store, `na`).
    Never,
}

/// Per-packet NAT times (ns) over `flows` established flows, `packets` packets.
fn nat_times(connector: &dyn Connector, model: Model, flows: usize, packets: usize) -> Vec<u64> {
    use crate::nf_throughput::{chains, flow_keys, frame};
    let table = chains()
        .into_iter()
        .find(|(n, _)| *n == "nat")
        .and_then(|(_, c)| c.first().map(|(_, t)| t.to_string()))
        .unwrap_or_default();
    let Ok(table) = toml::from_str::<toml::Table>(&table) else {
        return Vec::new();
    };
    let Ok(factory) = flowstate_nf::registry::factory("nat", &table) else {
        return Vec::new();
    };
    let config = StateConfig {
        uncached: model == Model::Uncached,
        ..StateConfig::default()
    };
    let Ok(mut part) = Partition::new(connector, config) else {
        return Vec::new();
    };
    let worker = flowstate_nf::Placement {
        partition: 0,
        partitions: 1,
        stage: 0,
    };
    let Ok(mut nf) = factory.build(&mut part.declare("nat"), worker) else {
        return Vec::new();
    };
    let frames: Vec<_> = flow_keys(flows).iter().map(frame).collect();
    let origin = Instant::now();
    let mut times = Vec::with_capacity(packets);
    let mut run = |i: usize, times: Option<&mut Vec<u64>>| {
        let mut f = frames[i % frames.len()];
        let t = Instant::now();
        let now = origin.elapsed().as_nanos() as u64;
        if let Ok(d) = flowstate_wire::dissect(&f) {
            let mut p = Packet {
                data: &mut f,
                dissection: d,
                direction: Direction::Outbound,
            };
            let cx = Context {
                now,
                clock: i as u64 + 1,
                partition: 0,
            };
            nf.process(&mut p, &cx);
        }
        match model {
            Model::Uncached => part.flush(now),
            Model::Each => {
                let _ = part.flush_all(now);
            }
            Model::Never => part.maybe_flush(now),
        }
        if let Some(times) = times {
            times.push(t.elapsed().as_nanos() as u64);
        }
    };
    // Every flow established (its mapping made and stored) first.
    for i in 0..flows {
        run(i, None);
    }
    for i in 0..packets {
        run(i, Some(&mut times));
    }
    let _ = part.flush_all(origin.elapsed().as_nanos() as u64);
    times
}

fn overheads(report: &mut Report, effort: Effort) {
    let (flows, packets, acked) = match effort {
        Effort::Full => (1_000, 1_000_000, 20_000),
        Effort::Quick => (1_000, 20_000, 2_000),
    };
    let Some((server, store)) = loopback_store(report, "overhead") else {
        return;
    };
    report
        .param("overhead_flows", flows as u64)
        .param("overhead_packets", packets as u64)
        .param("overhead_packets_acked_each", acked as u64);
    // (median, mean) µs.
    let stats = |mut v: Vec<u64>| {
        v.sort_unstable();
        let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        (
            v.get(v.len() / 2).copied().unwrap_or(0) as f64 / 1e3,
            mean / 1e3,
        )
    };
    let (t, t_mean) = stats(nat_times(&LocalStore::new(), Model::Never, flows, packets));
    let (eo, _) = stats(nat_times(&store, Model::Uncached, flows, acked));
    let (c, _) = stats(nat_times(&store, Model::Each, flows, acked));
    let (na, na_mean) = stats(nat_times(&store, Model::Never, flows, packets));
    report.metric("overhead_us_p50_t", t);
    report.metric("overhead_us_p50_eo", eo);
    report.metric("overhead_us_p50_c", c);
    report.metric("overhead_us_p50_na", na);
    // The mean carries what the median hides: `na`'s flush every 1 ms, amortized.
    report.metric("overhead_us_mean_t", t_mean);
    report.metric("overhead_us_mean_na", na_mean);
    report.ratio("na_vs_t_overhead_us", na - t);
    report.ratio("c_vs_na", c / na.max(1e-9));
    server.stop();
}

// ------------------------------------------------------------------------------------------
// R4: the trojan detector behind slow scrubbers

/// Inside hosts of the trojan trace (one in ten infected).
const HOSTS: u64 = 110;
/// A host's steps (SSH, FTP, IRC) apart, after compressing the trace's timeline.
const STEP_GAP_NS: u64 = 50_000;
/// The trojan profile's own step gap (its timeline is scaled by STEP_GAP_NS / this).
const PROFILE_STEP_NS: u64 = 2_000_000_000;

/// The scrubber a packet goes through: 0 SSH, 1 FTP (control and data), 2 IRC, `None` web.
fn scrubber(server_port: u16) -> Option<usize> {
    match server_port {
        22 => Some(0),
        80 => None,
        6660..=6669 | 6697 => Some(2),
        _ => Some(1),
    }
}

/// A packet of the trojan trace.
struct Traced {
    /// When it reaches the scrubbers, ns (the compressed timeline).
    time: u64,
    frame: Vec<u8>,
    direction: Direction,
    scrubber: Option<usize>,
    /// Its connection (client port, server port).
    flow: u64,
}

fn trojans(report: &mut Report) {
    let config = SynthConfig {
        flows: HOSTS,
        ..SynthConfig::new(Profile::Trojan)
    };
    let planted = flowstate_io::synth::infected(&config);
    let clients = config.clients_v4;
    let mut source = match Synthetic::new(config) {
        Ok(s) => s,
        Err(e) => {
            report.param("trojan_error", e.to_string());
            return;
        }
    };
    let mut trace = Vec::new();
    let mut batch = PacketBatch::new(64, 2048);
    loop {
        batch.clear();
        match source.recv(&mut batch) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        for (frame, meta) in batch.iter() {
            let Ok(d) = flowstate_wire::dissect(frame) else {
                continue;
            };
            let Some(f) = d.flow else { continue };
            let outbound = matches!(f.src, IpAddr::V4(a) if clients.contains(&a));
            let (direction, server_port, client_port) = if outbound {
                (Direction::Outbound, f.dst_port, f.src_port)
            } else {
                (Direction::Inbound, f.src_port, f.dst_port)
            };
            let t = (u128::from(meta.timestamp_ns) * u128::from(STEP_GAP_NS)
                / u128::from(PROFILE_STEP_NS)) as u64;
            let flow = u64::from(client_port) << 32 | u64::from(server_port);
            trace.push(Traced {
                time: t,
                frame: frame.to_vec(),
                direction,
                scrubber: scrubber(server_port),
                flow,
            });
        }
    }
    report
        .param("trojan_hosts", HOSTS)
        .param("trojan_step_gap_us", STEP_GAP_NS as f64 / 1e3)
        .param("scrubber_delay_us", "50-100")
        .param("trojan_trace_packets", trace.len() as u64);
    report.metric("trojans_planted", planted.len() as f64);
    let mut worst = (f64::MAX, f64::MAX);
    for (w, delayed) in [(1, &[0][..]), (2, &[0, 1][..]), (3, &[0, 1, 2][..])] {
        let order = scrubbed_order(&trace, delayed, 0x5eed + w as u64);
        let mut found = [0.0; 2];
        for (k, with_clocks) in [true, false].into_iter().enumerate() {
            let alerted = tracing::subscriber::with_default(
                tracing::subscriber::NoSubscriber::default(),
                || detect(&trace, &order, with_clocks),
            );
            let hits = alerted.iter().filter(|h| planted.contains(h)).count();
            let tag = if with_clocks { "with" } else { "without" };
            report.metric(&format!("trojans_found_{tag}_clocks_w{w}"), hits as f64);
            report.metric(
                &format!("false_alerts_{tag}_clocks_w{w}"),
                (alerted.len() - hits) as f64,
            );
            found[k] = hits as f64;
        }
        worst = (worst.0.min(found[0]), worst.1.min(found[1]));
    }
    report.metric("trojans_found_with_clocks", worst.0);
    report.metric("trojans_found_without_clocks", worst.1);
}

/// The order in which the trace's packets leave the scrubbers when those in `delayed` add a
/// random 50–100 µs to each packet, keeping each flow's packets in order.
fn scrubbed_order(trace: &[Traced], delayed: &[usize], seed: u64) -> Vec<usize> {
    let mut rng = seed;
    let mut last = std::collections::HashMap::new();
    let mut out: Vec<(u64, usize)> = trace
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let delay = match p.scrubber {
                Some(s) if delayed.contains(&s) => 50_000 + splitmix(&mut rng) % 50_001,
                _ => 0,
            };
            let prev = last.entry(p.flow).or_insert(0u64);
            let leaves = (p.time + delay).max(*prev);
            *prev = leaves;
            (leaves, i)
        })
        .collect();
    out.sort_by_key(|&(t, i)| (t, i));
    out.into_iter().map(|(_, i)| i).collect()
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The hosts the detector alerts on, fed the trace in `order`, with each packet's clock (its
/// place in the trace, + 1) or none.
fn detect(trace: &[Traced], order: &[usize], with_clocks: bool) -> Vec<IpAddr> {
    let store = LocalStore::new();
    let Ok(mut partition) = Partition::new(&store, StateConfig::default()) else {
        return Vec::new();
    };
    let Ok(mut nf) = Trojan::declare(&TrojanConfig::default(), &mut partition.declare("trojan"))
    else {
        return Vec::new();
    };
    let mut buf = Vec::new();
    for (n, &i) in order.iter().enumerate() {
        let Traced {
            frame, direction, ..
        } = &trace[i];
        // (Alerts are counted, not logged: see the no-subscriber scope in `trojans`.)
        buf.clear();
        buf.extend_from_slice(frame);
        let Ok(d) = flowstate_wire::dissect(&buf) else {
            continue;
        };
        let cx = Context {
            now: n as u64 * 1000,
            clock: if with_clocks { i as u64 + 1 } else { 0 },
            partition: 0,
        };
        let mut p = Packet {
            data: &mut buf,
            dissection: d,
            direction: *direction,
        };
        nf.process(&mut p, &cx);
    }
    nf.alerted_hosts()
}

// ------------------------------------------------------------------------------------------
// §7.1: offloaded operations vs lock, read, modify, write

fn counter_key(id: &str) -> ObjectKey {
    ObjectKey::shared("nat", Kind::Counter, id)
}

/// Per-packet latencies (ns) of one worker doing `packets` updates, offloaded or naively.
fn nat_worker(connector: &dyn Connector, packets: usize, offload: bool, owner: u64) -> Vec<u64> {
    let Ok(mut b) = connector.connect() else {
        return Vec::new();
    };
    let (ports, count) = (counter_key("ports_used"), counter_key("packets"));
    let mut replies = Vec::new();
    let mut lat = Vec::with_capacity(packets);
    for _ in 0..packets {
        let t = Instant::now();
        replies.clear();
        if offload {
            let ops = [
                Op::Add {
                    key: ports.clone(),
                    delta: 1,
                },
                Op::Add {
                    key: count.clone(),
                    delta: 1,
                },
            ];
            if b.execute(&ops, &mut replies).is_err() {
                return lat;
            }
        } else {
            // Lock (retrying while the other worker holds it), read both, write both, unlock.
            let lock = ObjectKey::shared("nat", Kind::Value, "lock");
            loop {
                replies.clear();
                let op = Op::Lock {
                    key: lock.clone(),
                    owner,
                    lease: Duration::from_secs(1),
                };
                if b.execute(std::slice::from_ref(&op), &mut replies).is_err() {
                    return lat;
                }
                if replies.first() == Some(&Reply::Bool(true)) {
                    break;
                }
            }
            replies.clear();
            let reads = [
                Op::GetCounter { key: ports.clone() },
                Op::GetCounter { key: count.clone() },
            ];
            if b.execute(&reads, &mut replies).is_err() {
                return lat;
            }
            let v: Vec<i64> = replies
                .iter()
                .map(|r| match r {
                    Reply::Int(n) => *n,
                    _ => 0,
                })
                .collect();
            replies.clear();
            let writes = [
                Op::SetCounter {
                    key: ports.clone(),
                    value: v.first().copied().unwrap_or(0) + 1,
                },
                Op::SetCounter {
                    key: count.clone(),
                    value: v.get(1).copied().unwrap_or(0) + 1,
                },
                Op::Unlock { key: lock, owner },
            ];
            if b.execute(&writes, &mut replies).is_err() {
                return lat;
            }
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat
}

fn offload_vs_lock(report: &mut Report, effort: Effort) {
    let packets = match effort {
        Effort::Full => 20_000,
        Effort::Quick => 500,
    };
    let Some((server, connector)) = loopback_store(report, "offload") else {
        return;
    };
    report
        .param("offload_workers", 2)
        .param("offload_packets_per_worker", packets as u64);
    let mut p50 = [0.0; 2];
    for (k, offload) in [true, false].into_iter().enumerate() {
        if let Ok(mut b) = connector.connect() {
            let mut r = Vec::new();
            let _ = b.execute(
                &[
                    Op::SetCounter {
                        key: counter_key("ports_used"),
                        value: 0,
                    },
                    Op::SetCounter {
                        key: counter_key("packets"),
                        value: 0,
                    },
                ],
                &mut r,
            );
        }
        let started = Instant::now();
        let lat: Vec<u64> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2u64)
                .map(|w| {
                    let c = &connector;
                    s.spawn(move || nat_worker(c, packets, offload, w + 1))
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let secs = started.elapsed().as_secs_f64();
        let name = if offload { "offload" } else { "lock_rw" };
        let mut sorted = lat.clone();
        sorted.sort_unstable();
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0) as f64 / 1e3;
        p50[k] = median;
        report.metric(&format!("{name}_us_p50"), median);
        report.metric(
            &format!("{name}_us_p99"),
            sorted.get(sorted.len() * 99 / 100).copied().unwrap_or(0) as f64 / 1e3,
        );
        report.metric(&format!("{name}_kpps"), lat.len() as f64 / secs / 1e3);
        // Every packet counted once: the counters are the packets.
        let counted = connector.connect().ok().and_then(|mut b| {
            let mut r = Vec::new();
            b.execute(
                &[Op::GetCounter {
                    key: counter_key("packets"),
                }],
                &mut r,
            )
            .ok()?;
            match r.pop() {
                Some(Reply::Int(n)) => Some(n),
                _ => None,
            }
        });
        report.metric(
            &format!("{name}_lost_updates"),
            (2 * packets) as f64 - counted.unwrap_or(0) as f64,
        );
    }
    if p50[0] > 0.0 {
        report.ratio("offload_vs_lock_rw", p50[1] / p50[0]);
    }
    server.stop();
}

// ------------------------------------------------------------------------------------------
// §5.4, Fig. 14: store recovery from checkpoint and log

/// A `flowstate store` process on `dir` at `port`, checkpointing every `interval_ms`.
fn store_process(dir: &Path, port: u16, interval_ms: u64) -> Option<Child> {
    let exe = std::env::current_exe().ok()?;
    Command::new(exe)
        .args(["store", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(dir)
        .args(["--checkpoint-interval", &format!("{interval_ms}ms")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// A connector to the store at `port` that fails at once when the store is gone (the
/// driver's default keeps reconnecting for 30 s).
fn impatient(port: u16) -> flowstate_driver_store::StoreConnector {
    flowstate_driver_store::StoreConnector::with_settings(flowstate_driver_store::Settings {
        addr: format!("127.0.0.1:{port}"),
        timeout: Duration::from_secs(1),
        retry_for: Duration::ZERO,
        ..flowstate_driver_store::Settings::default()
    })
}

/// Waits until the store at `port` answers a request; the time it took.
fn until_answers(port: u16, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let connector = impatient(port);
    while started.elapsed() < limit {
        if let Ok(mut b) = connector.connect() {
            let mut r = Vec::new();
            if b.execute(
                &[Op::GetCounter {
                    key: counter_key("packets"),
                }],
                &mut r,
            )
            .is_ok()
            {
                return Some(started.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Counters the writers update: `writers` × 64 shared objects.
const OBJECTS_PER_WRITER: usize = 64;

/// What one recovery took and found.
struct Recovery {
    /// From the restarted process's start until it answered.
    restart: Duration,
    /// The store's own time reading its checkpoints and log (`recovery_us`).
    rebuild: Duration,
    /// Log records it replayed.
    records: u64,
    /// Every acknowledged increment is in the recovered state.
    complete: bool,
}

/// One recovery: `writers` clients increment shared counters for `load`, then the store is
/// killed and started again.
fn recover_once(
    dir: &Path,
    port: u16,
    writers: usize,
    interval_ms: u64,
    load: Duration,
) -> Option<Recovery> {
    let _ = std::fs::remove_dir_all(dir);
    let mut store = store_process(dir, port, interval_ms)?;
    until_answers(port, Duration::from_secs(10))?;
    let connector = impatient(port);
    let key = |w: usize, o: usize| counter_key(&format!("w{w}.o{o}"));
    // Each writer: batches of 64 increments, one per object, acknowledged.
    let acked: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let c = &connector;
                s.spawn(move || {
                    let Ok(mut b) = c.connect() else { return 0 };
                    let ops: Vec<Op> = (0..OBJECTS_PER_WRITER)
                        .map(|o| Op::Add {
                            key: key(w % 5, o),
                            delta: 1,
                        })
                        .collect();
                    let mut r = Vec::new();
                    let mut rounds = 0u64;
                    let end = Instant::now() + load;
                    while Instant::now() < end {
                        r.clear();
                        if b.execute(&ops, &mut r).is_err() {
                            break;
                        }
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        std::thread::sleep(load);
        // SIGKILL while the writers are still writing.
        let _ = store.kill();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
    });
    let _ = store.wait();
    let mut store = store_process(dir, port, interval_ms)?;
    let took = until_answers(port, Duration::from_secs(60));
    // Writers w and w + 5 share objects (CHC: NATs updating the same state objects).
    let mut want = vec![0u64; 5];
    for (w, n) in acked.iter().enumerate() {
        want[w % 5] += n;
    }
    let complete = took.is_some()
        && connector.connect().ok().is_some_and(|mut b| {
            let ops: Vec<Op> = (0..5.min(writers))
                .map(|w| Op::GetCounter { key: key(w, 0) })
                .collect();
            let mut r = Vec::new();
            b.execute(&ops, &mut r).is_ok()
                && r.iter()
                    .zip(&want)
                    .all(|(got, &w)| matches!(got, Reply::Int(n) if *n as u64 >= w))
        });
    let stats = connector
        .open()
        .and_then(|mut b| b.stats())
        .unwrap_or_default();
    let stat = |name: &str| stats.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v);
    let _ = store.kill();
    let _ = store.wait();
    Some(Recovery {
        restart: took?,
        rebuild: Duration::from_micros(stat("recovery_us")),
        records: stat("recovered_records"),
        complete,
    })
}

fn store_recovery(report: &mut Report, effort: Effort) {
    let load = match effort {
        Effort::Full => Duration::from_secs(1),
        Effort::Quick => Duration::from_millis(200),
    };
    let Ok(dir) = std::env::temp_dir()
        .join(format!("flowstate-chc-{}", std::process::id()))
        .canonicalize()
        .or_else(|_| {
            let d = std::env::temp_dir().join(format!("flowstate-chc-{}", std::process::id()));
            std::fs::create_dir_all(&d).map(|()| d)
        })
    else {
        return;
    };
    let port = 17_000 + (std::process::id() % 1000) as u16;
    // An empty store's start-up, subtracted from every recovery.
    let base = {
        let d = dir.join("empty");
        let _ = std::fs::remove_dir_all(&d);
        let t = store_process(&d, port, 1000).and_then(|mut c| {
            let t = until_answers(port, Duration::from_secs(10));
            let _ = c.kill();
            let _ = c.wait();
            t
        });
        t.unwrap_or_default()
    };
    report.metric("store_startup_ms", base.as_secs_f64() * 1e3);
    report.param("store_recovery_load_s", load.as_secs_f64());
    let mut all_complete = true;
    for writers in [5, 10] {
        for interval in [30, 75, 150] {
            let Some(r) = recover_once(&dir.join("data"), port, writers, interval, load) else {
                continue;
            };
            all_complete &= r.complete;
            let tag = format!("{writers}w_{interval}ms");
            let ms = r.rebuild.as_secs_f64() * 1e3;
            report.metric(&format!("store_recovery_ms_{tag}"), ms);
            report.metric(
                &format!("store_restart_ms_{tag}"),
                r.restart.saturating_sub(base).as_secs_f64() * 1e3,
            );
            report.metric(&format!("store_recovered_records_{tag}"), r.records as f64);
            if tag == "10w_150ms" {
                report.metric("store_recovery_ms", ms);
            }
        }
    }
    report.metric("store_recovery_complete", f64::from(u8::from(all_complete)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The R6 experiments in the namespace lab.
#[cfg(target_os = "linux")]
mod lab {
    use crate::cluster_lab::{cluster_config, root_counter, ClusterLab, Stream, Streamed};
    use crate::{Effort, Report};
    use std::time::Duration;

    pub(super) fn run(report: &mut Report, effort: Effort) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            report.param("lab", "skipped: needs root");
            return;
        }
        let (rate, secs) = match effort {
            Effort::Full => (4_000, 4),
            Effort::Quick => (2_000, 2),
        };
        report
            .param("lab_stream_rate", rate)
            .param("lab_stream_secs", secs);
        for (tag, log) in [("with", 65_536), ("without", 0)] {
            if let Err(e) = once(report, tag, log, rate, secs) {
                report.param(&format!("lab_error_{tag}_log"), e);
            }
        }
        if let Err(e) = straggler(report, rate, secs) {
            report.param("lab_error_straggler", e);
        }
    }

    /// R5: instance 1 runs 20 ms in every 120 (SIGSTOP/SIGCONT) under the stream, alive to
    /// the failure detector (5 missed reports), a straggler to the root (`straggler =
    /// "40ms"`). The duplicates its late outputs would have caused are what the root dropped.
    fn straggler(report: &mut Report, rate: u32, secs: u32) -> Result<(), String> {
        let c = ClusterLab::up("chs", 4)?;
        let config = cluster_config(3, "claim", false).replacen(
            "[cluster]\n",
            "[cluster]\nmissed = 5\nstraggler = \"40ms\"\n",
            1,
        );
        c.cluster_up("chs", &config)?;
        c.wait_settled(3, 30)?;
        let pid = c.role_pid("instance-1").ok_or("instance 1 does not run")? as libc::pid_t;
        let got = stream(&c, rate, secs, || {
            let until = std::time::Instant::now() + Duration::from_secs(u64::from(secs));
            // SAFETY: signals to a process of our cluster; it is left running or gone.
            while std::time::Instant::now() < until && unsafe { libc::kill(pid, 0) } == 0 {
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(100));
                unsafe { libc::kill(pid, libc::SIGCONT) };
                std::thread::sleep(Duration::from_millis(20));
            }
            unsafe { libc::kill(pid, libc::SIGCONT) };
            Ok(())
        })?;
        let status = c.wait_settled(3, 30)?;
        let log = std::fs::read_to_string(c.lab.state_dir().join("cluster/controller.log"))
            .unwrap_or_default();
        report.metric(
            "straggler_detected",
            f64::from(u8::from(log.contains("straggler"))),
        );
        report.metric("straggler_lost", f64::from(got.lost));
        report.metric(
            "duplicate_outputs_with_suppression",
            f64::from(got.duplicates),
        );
        report.metric(
            "duplicate_outputs_without_suppression",
            root_counter(&status, "duplicates_suppressed"),
        );
        report.metric("straggler_replayed", root_counter(&status, "replayed"));
        Ok(())
    }

    /// A stream of `secs` at `rate` with `during` done a second in.
    fn stream(
        c: &ClusterLab,
        rate: u32,
        secs: u32,
        during: impl FnOnce() -> Result<(), String>,
    ) -> Result<Streamed, String> {
        let s = Stream::start(&c.lab, rate * secs, rate, 32)?;
        std::thread::sleep(Duration::from_secs(1));
        let done = during();
        let got = s.finish(Duration::from_secs(1))?;
        done.map(|()| got)
    }

    fn once(report: &mut Report, tag: &str, log: u32, rate: u32, secs: u32) -> Result<(), String> {
        let c = ClusterLab::up("chc", 4)?;
        let config = cluster_config(3, "claim", false).replacen(
            "[cluster]\n",
            &format!("[cluster]\nlog_packets = {log}\n"),
            1,
        );
        c.cluster_up("chc", &config)?;
        c.wait_settled(3, 30)?;
        let nf = stream(&c, rate, secs, || {
            c.flowstate(&["cluster", "kill", "1"]).map(drop)
        })?;
        let status = c.wait_settled(3, 30)?;
        report.metric(&format!("nf_lost_{tag}_log"), f64::from(nf.lost));
        // Where a lost datagram could have gone, for the record.
        for key in [
            "outputs_missing",
            "lost_on_the_way",
            "hold_dropped",
            "no_owner",
            "log_abandoned",
            "log_evicted",
            "send_errors",
            "unlogged_outputs",
            "unresolved",
            "send_dropped",
        ] {
            report.metric(
                &format!("nf_root_{key}_{tag}_log"),
                root_counter(&status, key),
            );
        }
        let misdirected: u64 = (1..=4)
            .filter_map(|k| c.instance_file(k))
            .map(|i| i["misdirected"].as_u64().unwrap_or(0))
            .sum();
        report.metric(&format!("nf_misdirected_{tag}_log"), misdirected as f64);
        report.param(
            &format!("nf_missing_{tag}_log"),
            format!("{:?}", nf.missing),
        );
        report.metric(
            &format!("nf_duplicates_{tag}_log"),
            f64::from(nf.duplicates),
        );
        if log == 0 {
            return Ok(());
        }
        report.metric("nf_replayed", root_counter(&status, "replayed"));
        // The survivors' claims, from the controller's assignment to ready (the only moves).
        report.metric("nf_claim_ms_p50", root_counter(&status, "move_ms_p50"));
        report.metric(
            "nf_duplicates_suppressed",
            root_counter(&status, "duplicates_suppressed"),
        );
        // Replayed packets whose output died with the instance after their commit.
        let committed: u64 = (1..=4)
            .filter_map(|k| c.instance_file(k))
            .map(|i| i["replay_committed"].as_u64().unwrap_or(0))
            .sum();
        report.metric("nf_replay_committed", committed as f64);
        report.metric("nf_recovery_ms", nf.delay_ms_max - nf.delay_ms_p50);
        report.metric("nf_delay_ms_p50", nf.delay_ms_p50);
        // The root killed and started again.
        let path = c.scratch("chc.toml");
        let root = stream(&c, rate, secs, || {
            let pid = c.role_pid("root").ok_or("no root runs")?;
            // SAFETY: kill(2) on a pid of our cluster.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            // Dead (gone, or a zombie) before `cluster up` looks, or it sees the root running.
            flowstate_lab::wait_stopped(pid, Duration::from_secs(2));
            c.flowstate(&["cluster", "up", &path.to_string_lossy()])
                .map(drop)
        })?;
        let status = c.wait_settled(3, 30)?;
        report.metric("root_recovery_ms", root_counter(&status, "ready_ms"));
        report.metric("root_gap_ms", root.longest_gap_ms);
        report.metric("root_lost", f64::from(root.lost));
        report.param("root_missing", format!("{:?}", root.missing));
        report.metric("root_duplicates", f64::from(root.duplicates));
        Ok(())
    }
}
