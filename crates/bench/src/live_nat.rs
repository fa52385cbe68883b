//! `live-nat`: in the namespace lab (`flowstate_lab`), Linux's own NAT (nftables masquerade
//! with IPv4 forwarding in the `nf` namespace) against flowstate's NAT in the same place, over
//! AF_PACKET and over AF_XDP (generic mode), with real hosts on both sides:
//!
//! * **pps**: the client floods small UDP datagrams (`iperf3 -u -l 18 -b 0`, 60-byte frames)
//!   to the server; forwarded pps = datagrams the server received / seconds.
//! * **TCP goodput**: `iperf3` TCP, the receiver's bits per second.
//!
//! The boxes run one after another in one lab, in the same run; the claims are the
//! ratios ours/Linux (`ratios.xdp_vs_linux_pps`, `ratios.afpacket_vs_linux_pps`,
//! `ratios.xdp_vs_linux_tcp_goodput`, `ratios.afpacket_vs_linux_tcp_goodput`). The box runs
//! in this process (a thread in the `nf` namespace), one worker running to completion (the
//! live box's default), state on the local store.
//!
//! Besides, for flowstate's boxes, the CPU the box used (this process's CPU time over the
//! phase: the box's threads are all that run in it meanwhile), in cores
//! (`metrics.{afpacket,xdp}_{udp,tcp}_box_cores`), and what it forwarded per core
//! (`metrics.{afpacket,xdp}_forwarded_pps_per_box_core`, `..._tcp_mbps_per_box_core`, where
//! the box's thread used at least 0.05 of a core): on a shared machine the box may get far
//! less than a core, which the ratios alone do not show. `metrics.*_tcp_retransmits` is what
//! the TCP sender retransmitted.
//! `metrics.loadavg_1m_start` is the machine's load when the run began.
//!
//! Both flowstate boxes run as a live box does by default: with the XDP fast path
//! (`flowstate_fastpath::flowcache`) in front of the chain, so established flows are rewritten and
//! redirected by the kernel in the XDP hook, and only new flows, control packets and one
//! packet per flow and half refresh interval reach the AF_PACKET or AF_XDP socket and the
//! chain.
//! `afpacket_slow` and `xdp_slow` are the same boxes with `fast_path = false`: every packet
//! through the socket and the chain (`ratios.{afpacket,xdp}_slow_vs_linux_*`), which measures
//! the I/O itself. `metrics.{afpacket,xdp}_fast_path_share` is the share of the box's packets
//! (both phases) that the fast path forwarded. The fast path runs in softirq context, like
//! Linux's NAT, so the `*_box_cores` metrics count the chain's thread only.
//!
//! A last box, `afpacket_nice`, is the AF_PACKET slow path with its worker at nice -10
//! (`[runtime] nice`): the kernel's NAT runs in softirq context, ahead of every process,
//! while flowstate's worker waits its turn among the hosts' processes and whatever else the
//! machine runs; this variant shows how much of the gap is that wait.
//!
//! The pps the issue names counts what the server's `iperf3` received; on a shared machine
//! the server's process may not keep up with what the box delivers (its socket overflows).
//! `metrics.*_forwarded_pps` (and `ratios.*_vs_linux_forwarded_pps`) count the frames the box
//! sent out of its outside port during the flood (the port's kernel counter), for every box,
//! Linux's included.
//! Needs root, iproute2, nftables, ethtool, iperf3 (scripts/setup-live); without them the
//! report carries `params.error` and no ratio.

use crate::{Effort, Report};
use flowstate_lab::{Lab, System, BOX_OUTSIDE, SERVER};
use flowstate_router::Stop;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// Below this many cores of the box's own threads, per-core figures are not reported.
const MIN_CORES: f64 = 0.05;

/// The nice value of the extra AF_PACKET variant (`afpacket_nice_*`).
const NICE: i32 = -10;

pub(crate) fn run(effort: Effort) -> Report {
    let seconds = match effort {
        Effort::Full => 5,
        Effort::Quick => 1,
    };
    let mut report = Report::new("live-nat");
    report
        .param("seconds", seconds)
        .param("udp_payload_bytes", 18)
        .param("workers", 1)
        .param("afpacket_nice_variant_nice", NICE)
        .param(
            "lab",
            "client -- veth -- nf -- veth -- server, generic XDP, offloads off",
        );
    let prefix = format!("fs-bench{}-", std::process::id() % 100_000);
    let lab = match Lab::new(&prefix) {
        Ok(l) => l,
        Err(e) => {
            report.param("error", e.to_string());
            return report;
        }
    };
    let result = measure_all(&lab, seconds, &mut report);
    let _ = lab.down(&mut System::default());
    if let Err(e) = result {
        eprintln!("live-nat: {e}");
        report.param("error", e);
    }
    report
}

fn measure_all(lab: &Lab, seconds: u32, report: &mut Report) -> Result<(), String> {
    let mut exec = System::default();
    if let Some(load) = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
    {
        report.metric("loadavg_1m_start", load);
    }
    lab.up(&mut exec).map_err(|e| e.to_string())?;

    lab.kernel_nat(&mut exec, true).map_err(|e| e.to_string())?;
    let linux = measure(lab, seconds)?;
    lab.kernel_nat(&mut exec, false)
        .map_err(|e| e.to_string())?;

    let m = || measure(lab, seconds);
    let slow = "fast_path = false\n";
    let (afpacket, afpacket_box) = with_box(lab, "af-packet", "", None, m)?;
    let (xdp, xdp_box) = with_box(lab, "af-xdp", "", None, m)?;
    let (afpacket_slow, _) = with_box(lab, "af-packet", slow, None, m)?;
    let (xdp_slow, _) = with_box(lab, "af-xdp", slow, None, m)?;
    let (afpacket_nice, _) = with_box(lab, "af-packet", slow, Some(NICE), m)?;
    for (name, b) in [("afpacket", &afpacket_box), ("xdp", &xdp_box)] {
        let fast = b.live_box.get("fast_path_packets").copied().unwrap_or(0) as f64;
        report.metric(
            &format!("{name}_fast_path_share"),
            fast / (fast + b.packets_in as f64).max(1.0),
        );
    }

    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    for (name, m) in [
        ("linux", &linux),
        ("afpacket", &afpacket),
        ("xdp", &xdp),
        ("afpacket_slow", &afpacket_slow),
        ("xdp_slow", &xdp_slow),
        ("afpacket_nice", &afpacket_nice),
    ] {
        report.metric(&format!("{name}_pps"), m.pps);
        report.metric(&format!("{name}_udp_sent_pps"), m.sent_pps);
        report.metric(&format!("{name}_forwarded_pps"), m.forwarded_pps);
        report.metric(&format!("{name}_tcp_goodput_mbps"), m.tcp_bps / 1e6);
        report.metric(&format!("{name}_tcp_retransmits"), m.tcp_retransmits);
        if name != "linux" {
            // The claims: ours / Linux, same run.
            let vs = |what: &str, ours: f64, theirs: f64| {
                (format!("{name}_vs_linux_{what}"), ratio(ours, theirs))
            };
            for (key, r) in [
                vs("pps", m.pps, linux.pps),
                vs("tcp_goodput", m.tcp_bps, linux.tcp_bps),
                vs("forwarded_pps", m.forwarded_pps, linux.forwarded_pps),
            ] {
                report.ratio(&key, r);
            }
            report.metric(&format!("{name}_udp_box_cores"), m.udp_cores);
            report.metric(&format!("{name}_tcp_box_cores"), m.tcp_cores);
            // Per core only where the box's thread did the forwarding (not the fast path's
            // softirq, which no process is charged for).
            if m.udp_cores >= MIN_CORES && m.tcp_cores >= MIN_CORES {
                report.metric(
                    &format!("{name}_forwarded_pps_per_box_core"),
                    ratio(m.forwarded_pps, m.udp_cores),
                );
                report.metric(
                    &format!("{name}_tcp_mbps_per_box_core"),
                    ratio(m.tcp_bps / 1e6, m.tcp_cores),
                );
            }
        }
    }
    Ok(())
}

struct Measured {
    /// Datagrams the server received per second.
    pps: f64,
    /// Datagrams the client sent per second.
    sent_pps: f64,
    /// Frames the box sent out of its outside port per second during the flood: what it
    /// forwarded, whether or not the server's process then kept up with them.
    forwarded_pps: f64,
    /// TCP goodput at the receiver, bits per second.
    tcp_bps: f64,
    /// Segments the TCP sender retransmitted (losses, and reordering taken for loss).
    tcp_retransmits: f64,
    /// This process's CPU during the UDP and the TCP phase, in cores (a flowstate box's).
    udp_cores: f64,
    tcp_cores: f64,
}

/// This process's CPU time (user + system), and the wall clock.
fn cpu_now() -> (Duration, std::time::Instant) {
    // SAFETY: getrusage fills the rusage we pass.
    let cpu = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) != 0 {
            Duration::ZERO
        } else {
            let tv = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec.max(0) as u64)
                    + Duration::from_micros(t.tv_usec.max(0) as u64)
            };
            tv(u.ru_utime) + tv(u.ru_stime)
        }
    };
    (cpu, std::time::Instant::now())
}

/// Cores used since `since` (CPU time over wall time).
fn cores_since(since: (Duration, std::time::Instant)) -> f64 {
    let (cpu, _) = cpu_now();
    let wall = since.1.elapsed().as_secs_f64();
    if wall > 0.0 {
        cpu.saturating_sub(since.0).as_secs_f64() / wall
    } else {
        0.0
    }
}

fn iperf3(lab: &Lab, args: &[&str]) -> Result<serde_json::Value, String> {
    let server = SERVER.to_string();
    let mut argv = vec!["iperf3", "-c", server.as_str(), "--json"];
    argv.extend_from_slice(args);
    // The server may still be finishing the previous test (a flood can delay its end):
    // "busy" is retried for a while.
    for _ in 0..20 {
        let out = Command::new("ip")
            .args(["netns", "exec", &lab.client_ns()])
            .args(&argv)
            .output()
            .map_err(|e| format!("iperf3: {e}"))?;
        let j: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("iperf3 {}: {e}", argv.join(" ")))?;
        match j.get("error").and_then(|e| e.as_str()) {
            Some(e) if e.contains("busy") => std::thread::sleep(Duration::from_secs(1)),
            Some(e) => return Err(format!("iperf3 {}: {e}", argv.join(" "))),
            None => return Ok(j),
        }
    }
    Err(format!("iperf3 {}: the server stayed busy", argv.join(" ")))
}

/// Frames the box's outside port has sent so far (its kernel counter, whoever the box is).
fn outside_tx_packets(lab: &Lab) -> Result<u64, String> {
    let path = format!(
        "/sys/class/net/{}/statistics/tx_packets",
        flowstate_lab::NF_OUTSIDE_IF
    );
    let out = Command::new("ip")
        .args(["netns", "exec", &lab.nf_ns(), "cat", &path])
        .output()
        .map_err(|e| format!("reading {path}: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| format!("reading {path} in {}: not a number", lab.nf_ns()))
}

fn measure(lab: &Lab, seconds: u32) -> Result<Measured, String> {
    let t = seconds.to_string();
    let start = cpu_now();
    let tx0 = outside_tx_packets(lab)?;
    let udp = iperf3(lab, &["-u", "-l", "18", "-b", "0", "-t", &t])?;
    let tx1 = outside_tx_packets(lab)?;
    let udp_cores = cores_since(start);
    let sum = &udp["end"]["sum"];
    let secs = sum["seconds"].as_f64().unwrap_or(0.0).max(1e-9);
    let packets = sum["packets"].as_f64().unwrap_or(0.0);
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    // Let the flood drain before the TCP run.
    std::thread::sleep(Duration::from_millis(500));
    let start = cpu_now();
    let tcp = iperf3(lab, &["-t", &t])?;
    let tcp_cores = cores_since(start);
    Ok(Measured {
        udp_cores,
        tcp_cores,
        forwarded_pps: tx1.saturating_sub(tx0) as f64 / secs,
        pps: (packets - lost).max(0.0) / secs,
        sent_pps: packets / secs,
        tcp_bps: tcp["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0),
        tcp_retransmits: tcp["end"]["sum_sent"]["retransmits"]
            .as_f64()
            .unwrap_or(0.0),
    })
}

/// Runs `f` while flowstate's NAT runs as the box (in a thread inside the nf namespace).
fn with_box<T>(
    lab: &Lab,
    driver: &str,
    input_extra: &str,
    nice: Option<i32>,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(T, flowstate_chain::Summary), String> {
    let nice = nice.map(|n| format!("nice = {n}\n")).unwrap_or_default();
    let text = format!(
        "[input]\ninterface = \"{}\"\naddress = \"10.0.0.1\"\ndriver = \"{driver}\"\n{input_extra}\
         [output]\ninterface = \"{}\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\nworkers = 1\ninside = [\"10.0.0.0/24\"]\n{nice}\
         [state]\nbackend = \"local\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\n",
        flowstate_lab::NF_INSIDE_IF,
        flowstate_lab::NF_OUTSIDE_IF
    );
    run_box(lab, &text, f)
}

/// Runs `f` while a flowstate box configured by `text` (a live configuration on the lab's
/// `nf` ports) runs in a thread inside the `nf` namespace, once the client reaches the server
/// through it; returns what `f` returned and the box's summary.
pub(crate) fn run_box<T>(
    lab: &Lab,
    text: &str,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(T, flowstate_chain::Summary), String> {
    let config = flowstate_deploy::Config::parse(text, "box.toml").map_err(|e| e.to_string())?;
    let (
        flowstate_deploy::config::Input::Interface(inside),
        flowstate_deploy::config::Output::Interface(outside),
    ) = (config.input.clone(), config.output.clone())
    else {
        return Err("the box configuration is not a live one".into());
    };
    let factories = config.factories().map_err(|e| e.to_string())?;
    let runtime = flowstate_chain::Runtime::new(
        config.runtime_options(),
        factories,
        Arc::new(flowstate_state::local::LocalStore::new()),
    );
    let stop = Stop::new();
    let ns = format!("/run/netns/{}", lab.nf_ns());
    std::thread::scope(|s| {
        let boxed = s.spawn(|| -> Result<flowstate_chain::Summary, String> {
            let file = std::fs::File::open(&ns).map_err(|e| format!("{ns}: {e}"))?;
            // SAFETY: moves this thread (and the threads it starts) into the nf namespace.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(format!("setns {ns}: {}", std::io::Error::last_os_error()));
            }
            flowstate_chain::live::run(&runtime, &inside, &outside, stop.clone(), None)
                .map_err(|e| e.to_string())
        });
        // Wait until the client reaches the server through the box.
        let mut up = false;
        for _ in 0..40 {
            if boxed.is_finished() {
                break;
            }
            let ok = Command::new("ip")
                .args(["netns", "exec", &lab.client_ns()])
                .args(["ping", "-c1", "-W1", &SERVER.to_string()])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
                up = true;
                break;
            }
        }
        let r = if up {
            f()
        } else {
            Err("the box did not come up".to_string())
        };
        stop.stop();
        match boxed.join() {
            Ok(Ok(summary)) => r.map(|r| (r, summary)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the box panicked".to_string()),
        }
    })
}
