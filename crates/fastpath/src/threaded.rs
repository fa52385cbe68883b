//! The in-process realization with real threads: the fast path on one thread, the slow path
//! on another, and for lazy-p a pool of search threads, each with its own connection to the
//! store that holds the full tables (HyperSFC §IV: "distribute the tables of multiple NFs
//! across multiple CPU cores and perform parallel lookups").
//!
//! ```text
//!  packets --> fast path --done--> outputs
//!               ^   |
//!   installs,   |   | submit (packet + its (table, key) stack)
//!   returns     |   v
//!             slow path --(lazy-p)--> search threads --> the store
//! ```
//!
//! The link between the two is a pair of channels: a circulation costs two thread hand-offs
//! and the searches, as it costs two link traversals and the agent's searches in HyperSFC.
//! The slow path returns a packet with the entries its searches found, which the fast path
//! installs before it passes the packet on, so a flow's next packet finds them (one hand-off
//! per circulation). Threads block while they wait (polling threads would take
//! the cores the others need on a small machine), so their CPU time is the work they did; a
//! hand-off then costs a wake-up, a few to tens of microseconds.

use crate::fast::{Answer, FastPath, Packet, Step};
use crate::full::{Found, FullTables, Outcome, PrefixIndex, SlowError};
use crate::headers::Headers;
use crate::sim::serve;
use crate::table::Pipeline;
use crate::Mode;
use flowstate_state::Connector;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How packets are offered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offer {
    /// Packets in flight at most (1: each enters when the previous is done, the setting for
    /// measuring latency).
    pub window: usize,
    /// Packets per second offered (`None`: as fast as the window allows).
    pub rate_pps: Option<f64>,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// Per packet, in input order: its verdict.
    pub outcomes: Vec<Outcome>,
    /// Per packet: nanoseconds from entering the fast path to leaving it.
    pub latency_ns: Vec<u64>,
    /// Per packet: circulations.
    pub circulations: Vec<u8>,
    /// Bytes to the slow path.
    pub bytes_up: u64,
    /// Bytes back.
    pub bytes_down: u64,
    /// Full-table searches.
    pub searches: u64,
    /// CPU time of the slow path's threads (dispatcher and search threads).
    pub slow_cpu: Duration,
    /// CPU time of the fast path's thread.
    pub fast_cpu: Duration,
    /// From the first packet in to the last out.
    pub wall: Duration,
    /// The fast path's counters at the end.
    pub fast: crate::fast::FastStats,
}

enum ToFast {
    /// A packet back from the slow path, with the entries to install first and how many
    /// searches were answered.
    Return(Box<Packet>, Vec<(usize, Found)>, usize),
    Failed(SlowError),
}

/// The CPU time this thread has used.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

type Job = (usize, usize, u128); // search index, table, key
type JobAnswer = (usize, Result<Found, SlowError>);

/// Runs `packets` (headers and wire length) through `fast` with a slow path of `threads`
/// search threads (lazy-p; one otherwise) on the full tables in the store `connector` names.
pub fn run(
    fast: &mut FastPath,
    pipeline: &Pipeline,
    prefixes: &[Option<Arc<PrefixIndex>>],
    connector: Arc<dyn Connector>,
    threads: usize,
    packets: &[(Headers, u16)],
    offer: Offer,
) -> Result<RunReport, SlowError> {
    let (to_slow, slow_rx) = mpsc::channel::<Box<Packet>>();
    let (to_fast, fast_rx) = mpsc::channel::<ToFast>();
    let parallel = fast.mode() == Mode::LazyParallel;
    let workers = if parallel { threads.max(1) } else { 0 };
    let mut report = RunReport {
        outcomes: vec![
            Outcome {
                headers: Headers::default(),
                dropped: false
            };
            packets.len()
        ],
        latency_ns: vec![0; packets.len()],
        circulations: vec![0; packets.len()],
        ..RunReport::default()
    };
    let start = Instant::now();
    let slow_cpu = std::thread::scope(|scope| -> Result<Duration, SlowError> {
        // The search threads of lazy-p.
        let (answer_tx, answer_rx) = mpsc::channel::<JobAnswer>();
        let mut job_txs = Vec::new();
        let mut search_threads = Vec::new();
        for _ in 0..workers {
            let (job_tx, job_rx) = mpsc::channel::<Job>();
            job_txs.push(job_tx);
            let answer_tx = answer_tx.clone();
            let connector = Arc::clone(&connector);
            search_threads.push(scope.spawn(move || -> Result<Duration, SlowError> {
                let mut tables = FullTables::open(&*connector, pipeline, prefixes.to_vec())?;
                for (i, t, key) in job_rx {
                    let _ = answer_tx.send((i, tables.search(t, key)));
                }
                Ok(thread_cpu())
            }));
        }
        drop(answer_tx);
        // The slow path's dispatcher.
        let slow = {
            let to_fast = to_fast.clone();
            let connector = Arc::clone(&connector);
            scope.spawn(move || -> Result<(Duration, u64), SlowError> {
                let mut tables = FullTables::open(&*connector, pipeline, prefixes.to_vec())?;
                let mut searches = 0u64;
                for mut p in slow_rx {
                    let mut installs = Vec::new();
                    let answered = if job_txs.is_empty() || p.pending().count() < 2 {
                        let r = serve(&mut tables, &mut p, |t, f| installs.push((t, f)));
                        match r {
                            Ok(n) => n,
                            Err(e) => {
                                let _ = to_fast.send(ToFast::Failed(e));
                                break;
                            }
                        }
                    } else {
                        // Every (workers + 1)-th search is the dispatcher's own, done
                        // while the search threads do the others.
                        let pending: Vec<(usize, usize, u128)> = p
                            .searches()
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.answer == Answer::Pending)
                            .map(|(i, s)| (i, usize::from(s.table), s.key))
                            .collect();
                        let share = job_txs.len() + 1;
                        let mut sent = 0;
                        for (n, job) in pending.iter().enumerate() {
                            if n % share != 0 {
                                let _ = job_txs[sent % job_txs.len()].send(*job);
                                sent += 1;
                            }
                        }
                        let mut results: Vec<JobAnswer> = pending
                            .iter()
                            .step_by(share)
                            .map(|&(i, t, key)| (i, tables.search(t, key)))
                            .collect();
                        for _ in 0..sent {
                            match answer_rx.recv() {
                                Ok(a) => results.push(a),
                                Err(_) => break,
                            }
                        }
                        let mut failed = None;
                        for (i, found) in results {
                            let s = &mut p.searches_mut()[i];
                            match found {
                                Ok(f) => {
                                    s.answer = f.answer();
                                    installs.push((usize::from(s.table), f));
                                }
                                Err(e) => failed = Some(e),
                            }
                        }
                        if let Some(e) = failed {
                            let _ = to_fast.send(ToFast::Failed(e));
                            break;
                        }
                        pending.len()
                    };
                    searches += answered as u64;
                    let _ = to_fast.send(ToFast::Return(p, installs, answered));
                }
                drop(job_txs);
                Ok((thread_cpu(), searches))
            })
        };
        drop(to_fast);
        // The fast path, on this thread.
        let fast_result = drive(fast, packets, offer, &to_slow, &fast_rx, &mut report, start);
        drop(to_slow);
        let (mut cpu, searches) = slow.join().expect("the slow path does not panic")?;
        for t in search_threads {
            cpu += t.join().expect("a search thread does not panic")?;
        }
        report.searches = searches;
        fast_result?;
        Ok(cpu)
    })?;
    report.slow_cpu = slow_cpu;
    report.fast = fast.stats();
    Ok(report)
}

fn drive(
    fast: &mut FastPath,
    packets: &[(Headers, u16)],
    offer: Offer,
    to_slow: &mpsc::Sender<Box<Packet>>,
    from_slow: &mpsc::Receiver<ToFast>,
    report: &mut RunReport,
    start: Instant,
) -> Result<(), SlowError> {
    let cpu0 = thread_cpu();
    let mut next = 0usize;
    let mut in_flight = 0usize;
    let mut done = 0usize;
    let ns = |i: Instant| i.duration_since(start).as_nanos() as u64;
    let finish = |p: &Packet, dropped: bool, report: &mut RunReport| {
        let i = p.id as usize;
        report.outcomes[i] = Outcome {
            headers: p.headers,
            dropped,
        };
        report.latency_ns[i] = ns(Instant::now()).saturating_sub(p.born_ns);
        report.circulations[i] = p.circulations;
    };
    while done < packets.len() {
        // Admit what is due.
        let mut wait = Duration::from_millis(1);
        while next < packets.len() && in_flight < offer.window.max(1) {
            if let Some(rate) = offer.rate_pps {
                let due = start + Duration::from_secs_f64(next as f64 / rate);
                let now = Instant::now();
                if due > now {
                    wait = wait.min(due - now);
                    break;
                }
            }
            let (h, len) = packets[next];
            let mut p = Packet::new(next as u64, h, len, ns(Instant::now()));
            next += 1;
            match fast.pass(&mut p) {
                Step::Done { dropped } => {
                    finish(&p, dropped, report);
                    done += 1;
                }
                Step::Submit => {
                    report.bytes_up += p.submit_bytes();
                    in_flight += 1;
                    let _ = to_slow.send(Box::new(p));
                }
            }
        }
        if done == packets.len() {
            break;
        }
        // Take what the slow path sent; block when there is nothing else to do.
        let blocked = in_flight > 0 && (next == packets.len() || in_flight >= offer.window.max(1));
        let wait = if blocked {
            Duration::from_secs(3600)
        } else {
            wait
        };
        let mut msg = match from_slow.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(SlowError::Stopped),
        };
        while let Some(m) = msg {
            match m {
                ToFast::Failed(e) => return Err(e),
                ToFast::Return(mut p, installs, answered) => {
                    for (t, found) in &installs {
                        fast.install(*t, found);
                    }
                    report.bytes_down += p.return_bytes(answered);
                    match fast.pass(&mut p) {
                        Step::Done { dropped } => {
                            finish(&p, dropped, report);
                            done += 1;
                            in_flight -= 1;
                        }
                        Step::Submit => {
                            report.bytes_up += p.submit_bytes();
                            let _ = to_slow.send(p);
                        }
                    }
                }
            }
            msg = from_slow.try_recv().ok();
        }
    }
    report.wall = start.elapsed();
    report.fast_cpu = thread_cpu().saturating_sub(cpu0);
    Ok(())
}
