//! `nat-churn`: in the namespace lab, short TCP connections as fast as a NAT with a small
//! port pool and short timeouts lets them through, Linux's NAT against flowstate's (issue #21,
//! "NAT port exhaustion under short-lived connection churn").
//!
//! Both NATs get the same pool, [`POOL`] external ports (`ports = "20000-20099"`; nftables
//! `masquerade to :20000-20099`), and the same time a closed connection holds its port,
//! [`CLOSED_HOLD_S`] (flowstate's `tcp_transitory`; conntrack's `close`, `time_wait`,
//! `fin_wait`, `close_wait` and `last_ack` timeouts in the box's namespace). The client opens
//! connections from [`THREADS`] threads for the phase's seconds: connect, read the server's one
//! byte, close with a reset (`SO_LINGER` 0, so neither host keeps a TIME-WAIT that would
//! block a port's reuse); a connection that does not complete within [`CONNECT_TIMEOUT_S`]
//! (its SYN dropped for want of a port) counts as failed.
//!
//! Neither NAT waits out the hold when it needs a port: conntrack lets a new connection take
//! the tuple of a closed one, and flowstate's early drop (`early_drop = true`, the default)
//! ends a closed session to free its port. So the limit is how fast each NAT sets connections
//! up and tears them down. A third box, `flowstate_no_early_drop`, waits the hold out: at most
//! `POOL / CLOSED_HOLD_S` connections a second (`metrics.pool_bound_conn_per_s`), the rest
//! dropped as `nat.pool_exhausted` until ports come back.
//!
//! Reports connections completed per second for each
//! (`metrics.{linux,flowstate,flowstate_no_early_drop}_conn_per_s`), failed attempts, the time
//! from the end of the churn until a new connection gets through again (`metrics.*_recovery_s`),
//! flowstate's drops by reason, and `ratios.nat_churn_vs_linux` (flowstate with its defaults;
//! goal ≥ 1). One worker, the live box's default; the run needs
//! root, nftables, conntrack's sysctls and python3 (scripts/setup-live), else `params.error`.

use crate::live_nat::run_box;
use crate::{Effort, Report};
use flowstate_lab::{Lab, System, BOX_OUTSIDE, CLIENT, KERNEL_NAT_TABLE, SERVER};
use std::process::{Child, Command, Stdio};

/// External ports in the pool.
pub const POOL: u16 = 100;
/// Seconds a closed connection holds its port.
pub const CLOSED_HOLD_S: u32 = 1;
/// Client threads.
pub const THREADS: u32 = 32;
/// Seconds a connection attempt may take.
pub const CONNECT_TIMEOUT_S: f64 = 0.3;
/// The server's port.
const PORT: u16 = 9100;

/// The churn client and its server (python3; see the module docs):
/// `accept PORT` answers each connection with one byte and closes it;
/// `churn SRC DST PORT SECONDS ATTEMPTS THREADS TIMEOUT` opens connections until the seconds
/// are up or the attempts made (0: no bound) and prints `{"ok": .., "failed": .., "seconds": ..}`;
/// `probe SRC DST PORT TIMEOUT SECONDS` tries one connection at a time until one completes and
/// prints the seconds it took (or fails after SECONDS).
pub const CHURN_PY: &str = r#"
import json, socket, struct, sys, threading, time
LINGER0 = struct.pack("ii", 1, 0)
def once(src, dst, port, timeout):
    s = socket.socket(); s.settimeout(timeout)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
    try:
        s.bind((src, 0)); s.connect((dst, port)); return s.recv(1) == b"x"
    except OSError:
        return False
    finally:
        s.close()
cmd, a = sys.argv[1], sys.argv[2:]
if cmd == "accept":
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", int(a[0]))); l.listen(1024)
    while True:
        c, _ = l.accept()
        try:
            c.sendall(b"x")
        except OSError:
            pass
        c.close()
elif cmd == "churn":
    src, dst, port, secs, attempts, threads, timeout = a[0], a[1], int(a[2]), float(a[3]), int(a[4]), int(a[5]), float(a[6])
    lock = threading.Lock(); n = {"ok": 0, "failed": 0, "left": attempts}
    start = time.time(); end = start + secs
    def work():
        while time.time() < end:
            with lock:
                if attempts and n["left"] == 0:
                    return
                n["left"] -= 1
            r = once(src, dst, port, timeout)
            with lock:
                n["ok" if r else "failed"] += 1
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    print(json.dumps({"ok": n["ok"], "failed": n["failed"], "seconds": time.time() - start}))
elif cmd == "probe":
    src, dst, port, timeout, secs = a[0], a[1], int(a[2]), float(a[3]), float(a[4])
    start = time.time()
    while time.time() - start < secs:
        if once(src, dst, port, timeout):
            print(time.time() - start); sys.exit(0)
        time.sleep(0.02)
    sys.exit(1)
"#;

/// What one NAT let through.
#[derive(Debug, Clone, Copy)]
pub struct Churned {
    /// Connections completed.
    pub ok: u64,
    /// Attempts that did not complete.
    pub failed: u64,
    /// Seconds the churn ran.
    pub seconds: f64,
    /// Seconds from the end of the churn until a connection completed again.
    pub recovery_s: f64,
}

pub(crate) fn run(effort: Effort) -> Report {
    let seconds = match effort {
        Effort::Full => 10,
        Effort::Quick => 3,
    };
    let mut report = Report::new("nat-churn");
    report
        .param("seconds", seconds)
        .param("pool_ports", POOL)
        .param("closed_hold_s", CLOSED_HOLD_S)
        .param("client_threads", THREADS)
        .param("connect_timeout_s", CONNECT_TIMEOUT_S)
        .param("workers", 1)
        .param(
            "connection",
            "connect, read 1 byte, close with RST (SO_LINGER 0)",
        );
    let prefix = format!("fs-churn{}-", std::process::id() % 100_000);
    let lab = match Lab::new(&prefix) {
        Ok(l) => l,
        Err(e) => {
            report.param("error", e.to_string());
            return report;
        }
    };
    let result = measure_all(&lab, f64::from(seconds), &mut report);
    let _ = lab.down(&mut System::default());
    if let Err(e) = result {
        eprintln!("nat-churn: {e}");
        report.param("error", e);
    }
    report
}

fn measure_all(lab: &Lab, seconds: f64, report: &mut Report) -> Result<(), String> {
    let mut exec = System::default();
    lab.up(&mut exec).map_err(|e| e.to_string())?;
    let script = lab.state_dir().join("churn.py");
    std::fs::write(&script, CHURN_PY).map_err(|e| format!("{}: {e}", script.display()))?;
    let mut server = Server::start(lab, &script)?;

    // Linux: masquerade onto the same pool, conntrack's closing states held as long.
    lab.kernel_nat(&mut exec, true).map_err(|e| e.to_string())?;
    let linux = (|| {
        let nf = lab.nf_ns();
        let ports = format!("{}-{}", 20000, 20000 + POOL - 1);
        sh(&Lab::in_ns(
            &nf,
            &["nft", "flush", "chain", "ip", KERNEL_NAT_TABLE, "post"],
        ))?;
        sh(&Lab::in_ns(
            &nf,
            &[
                "nft",
                "add",
                "rule",
                "ip",
                KERNEL_NAT_TABLE,
                "post",
                "oifname",
                flowstate_lab::NF_OUTSIDE_IF,
                "meta",
                "l4proto",
                "tcp",
                "masquerade",
                "to",
                &format!(":{ports}"),
            ],
        ))?;
        for state in ["close", "time_wait", "fin_wait", "close_wait", "last_ack"] {
            sh(&Lab::in_ns(
                &nf,
                &[
                    "sysctl",
                    "-qw",
                    &format!("net.netfilter.nf_conntrack_tcp_timeout_{state}={CLOSED_HOLD_S}"),
                ],
            ))?;
        }
        churn(lab, &script, seconds, 0)
    })();
    lab.kernel_nat(&mut exec, false)
        .map_err(|e| e.to_string())?;
    let linux = linux?;

    let hold = format!("{CLOSED_HOLD_S}s");
    let (ours, summary) = run_box(lab, &box_config(&hold, true), || {
        churn(lab, &script, seconds, 0)
    })?;
    let (waiting, waiting_summary) = run_box(lab, &box_config(&hold, false), || {
        churn(lab, &script, seconds, 0)
    })?;
    server.stop();

    let per_s = |c: &Churned| c.ok as f64 / c.seconds.max(1e-9);
    for (name, c) in [
        ("linux", &linux),
        ("flowstate", &ours),
        ("flowstate_no_early_drop", &waiting),
    ] {
        report.metric(&format!("{name}_conn_per_s"), per_s(c));
        report.metric(&format!("{name}_completed"), c.ok as f64);
        report.metric(&format!("{name}_failed"), c.failed as f64);
        report.metric(&format!("{name}_recovery_s"), c.recovery_s);
    }
    report.metric(
        "pool_bound_conn_per_s",
        f64::from(POOL) / f64::from(CLOSED_HOLD_S),
    );
    for (name, s) in [
        ("flowstate", &summary),
        ("flowstate_no_early_drop", &waiting_summary),
    ] {
        for (reason, n) in &s.dropped {
            let key = format!("{name}_dropped_{}", reason.replace('.', "_"));
            report.metric(&key, *n as f64);
        }
        let nat = s.nfs.iter().find(|n| n.name == "nat");
        let early = nat.and_then(|n| n.report.get("early_drops")).copied();
        report.metric(&format!("{name}_early_drops"), early.unwrap_or(0) as f64);
    }
    let linux_rate = per_s(&linux);
    report.ratio(
        "nat_churn_vs_linux",
        if linux_rate > 0.0 {
            per_s(&ours) / linux_rate
        } else {
            0.0
        },
    );
    Ok(())
}

/// A live NAT box's configuration with the churn pool, `closed_hold` as its transitory TCP
/// timeout, and early drop on or off.
pub fn box_config(closed_hold: &str, early_drop: bool) -> String {
    format!(
        "[input]\ninterface = \"{}\"\naddress = \"10.0.0.1\"\n\
         [output]\ninterface = \"{}\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\nworkers = 1\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"local\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-{}\"\n\
         tcp_transitory = \"{closed_hold}\"\nearly_drop = {early_drop}\n",
        flowstate_lab::NF_INSIDE_IF,
        flowstate_lab::NF_OUTSIDE_IF,
        20000 + POOL - 1,
    )
}

/// The accepting server in the lab's server namespace, stopped when dropped.
struct Server(Option<Child>);

impl Server {
    fn start(lab: &Lab, script: &std::path::Path) -> Result<Server, String> {
        let argv = Lab::in_ns(
            &lab.server_ns(),
            &[
                "python3",
                &script.to_string_lossy(),
                "accept",
                &PORT.to_string(),
            ],
        );
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("python3: {e}"))?;
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(Server(Some(child)))
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn sh(argv: &[String]) -> Result<String, String> {
    let o = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if !o.status.success() {
        return Err(format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Churns for `seconds` (or until `attempts`, when not 0) from the client, then measures
/// how long until a connection gets through again.
pub fn churn(
    lab: &Lab,
    script: &std::path::Path,
    seconds: f64,
    attempts: u64,
) -> Result<Churned, String> {
    let script = script.to_string_lossy();
    let (client, server, port) = (CLIENT.to_string(), SERVER.to_string(), PORT.to_string());
    let out = sh(&Lab::in_ns(
        &lab.client_ns(),
        &[
            "python3",
            &script,
            "churn",
            &client,
            &server,
            &port,
            &seconds.to_string(),
            &attempts.to_string(),
            &THREADS.to_string(),
            &CONNECT_TIMEOUT_S.to_string(),
        ],
    ))?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("churn said {out:?}: {e}"))?;
    let recovery = sh(&Lab::in_ns(
        &lab.client_ns(),
        &[
            "python3",
            &script,
            "probe",
            &client,
            &server,
            &port,
            &CONNECT_TIMEOUT_S.to_string(),
            "30",
        ],
    ))?;
    Ok(Churned {
        ok: v["ok"].as_u64().unwrap_or(0),
        failed: v["failed"].as_u64().unwrap_or(0),
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
        recovery_s: recovery
            .trim()
            .parse()
            .map_err(|e| format!("probe said {recovery:?}: {e}"))?,
    })
}
