//! What exporting metrics costs the data path (issue #20): the chain runtime on generated
//! traffic with an [`Observer`] and a `flowstate-telemetry` listener scraped every 100 ms by
//! a thread of the same process, against the same run without, alternating in one bench run.
//!
//! The runtime is the real one (`Runtime::run_generated`: one worker generating its traffic,
//! dissecting, running the NAT, publishing its counters every 100 ms when observed), so the
//! ratio counts everything `--metrics` adds: the per-batch clock comparison and histogram
//! increment, the snapshots, and the listener's and scraper's threads on the same cores.

use crate::Report;
use flowstate_chain::observe::Observer;
use flowstate_chain::{synthetic_share, Runtime, RuntimeOptions};
use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_state::local::LocalStore;
use flowstate_telemetry::{Metrics, Provider, Server};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the scraper asks.
const SCRAPE_EVERY: Duration = Duration::from_millis(100);

/// A provider that exports what `flowstate run --metrics` exports in kind: the summary's
/// counters, per NF and per worker, and the batch-time histograms.
struct Exported(Arc<Observer>);

impl Provider for Exported {
    fn metrics(&self, m: &mut Metrics) {
        let Some(s) = self.0.summary() else { return };
        m.counter("input_packets", "Packets read.", &[], s.packets_in);
        m.counter("output_packets", "Packets forwarded.", &[], s.packets_out);
        for nf in &s.nfs {
            m.counter(
                "nf_packets",
                "NF packets.",
                &[("nf", &nf.name)],
                nf.packets_in,
            );
            for (reason, n) in &nf.dropped {
                m.counter(
                    "drops",
                    "Drops.",
                    &[("nf", &nf.name), ("reason", reason)],
                    *n,
                );
            }
            for (k, v) in &nf.report {
                m.gauge(&format!("nf_{k}"), "NF report.", &[("nf", &nf.name)], *v);
            }
        }
        for w in &s.per_worker {
            let i = w.index.to_string();
            m.counter(
                "state_flushes",
                "Flushes.",
                &[("worker", &i)],
                w.state_flushes,
            );
        }
        for t in self.0.batch_times() {
            let i = t.worker.to_string();
            let h = flowstate_telemetry::Histogram::from_log2(&t.buckets, 1e-6, t.sum_s);
            m.histogram(
                "batch_duration_seconds",
                "Batch time.",
                &[("worker", &i)],
                h,
            );
        }
    }

    fn api(&self, _: &str) -> Option<String> {
        None
    }
}

/// What a run exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing (no observer).
    Off,
    /// The workers publish to an observer; no listener.
    Published,
    /// Published, served and scraped every [`SCRAPE_EVERY`].
    Scraped,
}

/// One run's throughput (Mpps by wall clock), its packets per process CPU-second (all
/// threads: workers, listener, scraper) in millions, and the scrapes answered.
fn one_run(trace: &SynthConfig, mode: Mode) -> (f64, f64, u64) {
    let nat: toml::Table = "external = [\"203.0.113.1\", \"203.0.113.2\"]\nports = \"1024-65535\""
        .parse()
        .expect("bench config");
    let chain = vec![flowstate_nf::registry::factory("nat", &nat).expect("nat")];
    let options = RuntimeOptions {
        workers: 1,
        ..RuntimeOptions::default()
    };
    let mut runtime = Runtime::new(options, chain, Arc::new(LocalStore::new()));
    let scrapes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut exporter = None;
    if mode == Mode::Published {
        runtime = runtime.with_observer(Observer::new());
    }
    if mode == Mode::Scraped {
        let observer = Observer::new();
        runtime = runtime.with_observer(Arc::clone(&observer));
        let server = Server::start(
            "127.0.0.1:0".parse().expect("address"),
            Arc::new(Exported(observer)),
        )
        .expect("telemetry listener");
        let addr = server.local_addr();
        let (scrapes, stop) = (Arc::clone(&scrapes), Arc::clone(&stop));
        let scraper = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let page = std::net::TcpStream::connect(addr).and_then(|mut c| {
                    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
                    let mut page = String::new();
                    c.read_to_string(&mut page)?;
                    Ok(page)
                });
                if page.is_ok_and(|p| p.contains("flowstate_")) {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(SCRAPE_EVERY);
            }
        });
        exporter = Some((server, scraper));
    }
    let cpu0 = process_cpu_seconds();
    let summary = runtime
        .run_generated(
            |w| Synthetic::new(synthetic_share(trace, w).unwrap_or_else(|| trace.clone())),
            None,
        )
        .expect("the chain runs");
    let cpu = process_cpu_seconds() - cpu0;
    stop.store(true, Ordering::Relaxed);
    if let Some((server, scraper)) = exporter {
        let _ = scraper.join();
        server.stop();
    }
    let per_cpu = summary.packets_in as f64 / cpu.max(1e-9) / 1e6;
    (summary.mpps, per_cpu, scrapes.load(Ordering::Relaxed))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Adds `metrics_*` to `report`: `runs` rounds of three runs of `packets` packets each (off,
/// published only, published and scraped; the order rotating), medians per mode.
pub(crate) fn measure(report: &mut Report, packets: u64, runs: usize) {
    let mut trace = SynthConfig::new(Profile::Mixed);
    trace.flows = 10_000;
    trace.packets = packets;
    report
        .param("metrics_packets_per_run", packets)
        .param("metrics_runs", runs)
        .param(
            "metrics_scrape_interval_ms",
            SCRAPE_EVERY.as_millis() as u64,
        );
    let modes = [Mode::Off, Mode::Published, Mode::Scraped];
    let mut mpps: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let mut scrapes = 0;
    // A warm-up run (page cache, allocator, CPU frequency), not counted.
    let _ = one_run(&trace, Mode::Off);
    for r in 0..runs {
        // The order rotates from run to run, so no mode always follows another.
        for k in 0..modes.len() {
            let i = (k + r) % modes.len();
            let (m, c, n) = one_run(&trace, modes[i]);
            mpps[i].push(m);
            cpu[i].push(c);
            scrapes += n;
        }
    }
    let [off, published, on] = mpps.map(|mut v| median(&mut v));
    let [off_cpu, published_cpu, on_cpu] = cpu.map(|mut v| median(&mut v));
    report.metric("metrics_off_mpps", off);
    report.metric("metrics_published_mpps", published);
    report.metric("metrics_on_mpps", on);
    report.metric("metrics_off_mpps_per_cpu_second", off_cpu);
    report.metric("metrics_published_mpps_per_cpu_second", published_cpu);
    report.metric("metrics_on_mpps_per_cpu_second", on_cpu);
    report.metric("metrics_scrapes", scrapes as f64);
    if off > 0.0 {
        report.ratio("metrics_on_vs_off", on / off);
        report.ratio("metrics_published_vs_off", published / off);
    }
    if off_cpu > 0.0 {
        report.ratio("metrics_on_vs_off_per_cpu_second", on_cpu / off_cpu);
        report.ratio(
            "metrics_published_vs_off_per_cpu_second",
            published_cpu / off_cpu,
        );
    }
}

/// CPU time of the whole process, seconds.
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id a constant libc defines.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
        return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    }
    0.0
}
