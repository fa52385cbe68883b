//! `ips`: the IPS (`nf = "ips"`) against Suricata on the same capture with the same rules
//! (StatelessNF §7.2.3 compares its IPS with Snort).
//!
//! * **Traffic**: a `mixed` synthetic trace (`flowstate_io::synth`: 80 % TCP, flow sizes
//!   bounded-Pareto on 10–1,000 packets, application payloads on well-known ports) written to
//!   a pcap.
//! * **Rules**: 100, 1,000 and 10,000 generated content rules (`gen_rules`, seeded): most
//!   with one random 8-byte content (they never match), some with two contents and
//!   `flow:to_server,established`, some UDP rules on port 53 with hex contents, and one in a
//!   hundred with contents the trace's payloads hold (an HTTP request line, a response
//!   status, a TLS ClientHello's server name, SSH banners, DNS names, SMTP commands, counter
//!   bytes), so alerts are raised and compared.
//! * **Both tools single-threaded as deployed**: `flowstate run` with one worker and the
//!   IPS alone, EVE to a file (`--eve`); `suricata --runmode single -k none -r` with Debian's
//!   `/etc/suricata/suricata.yaml` (which also parses and logs application protocols: what
//!   Suricata does when it runs). Each tool's cost is the CPU time (user + system, of the
//!   process and its threads, from `wait4`) of the run on the trace minus that of a run on
//!   the trace's first packet with the same rules, so loading and compiling rules is not
//!   counted.
//! * **Metrics**: `{ips,suricata}_mpps_per_core_{100,1k,10k}`, `..._gbps_per_core_...` (frame
//!   bytes), `..._alerts_...` (EVE alert lines: ours alert once per flow and sid, Suricata on
//!   every matching packet), `..._alert_pairs_...` (distinct (sid, flow)) and
//!   `common_alert_pairs_...`. **Ratios**: `ips_vs_suricata_{100,1k,10k}_rules` = our packets
//!   per CPU second / Suricata's.
//!
//! Needs `suricata` (scripts/setup-live installs it); without it the report carries
//! `params.error`. With `FLOWSTATE_BENCH_KEEP` set, the traces, rules and both tools' output
//! stay where `params.kept` says.

use crate::{Effort, Report};
use flowstate_io::pcap::PcapWriter;
use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, Source};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub(crate) fn run(effort: Effort) -> Report {
    let mut report = Report::new("ips");
    let dir = std::env::temp_dir().join(format!("flowstate-bench-ips-{}", std::process::id()));
    if let Err(e) = measure(effort, &dir, &mut report) {
        report.param("error", e);
    }
    if std::env::var_os("FLOWSTATE_BENCH_KEEP").is_some() {
        report.param("kept", dir.to_string_lossy().into_owned());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    report
}

fn measure(effort: Effort, dir: &Path, report: &mut Report) -> Result<(), String> {
    let version = Command::new("suricata")
        .arg("-V")
        .output()
        .map_err(|e| format!("no suricata ({e}): scripts/setup-live installs it"))?;
    report.param(
        "suricata",
        String::from_utf8_lossy(&version.stdout).trim().to_owned(),
    );
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (flows, packets) = match effort {
        Effort::Full => (17_000, 800_000),
        Effort::Quick => (500, 20_000),
    };
    report
        .param("profile", "mixed")
        .param("flows", flows)
        .param("packets", packets);
    let trace = dir.join("mixed.pcap");
    let first = dir.join("first.pcap");
    let bytes = write_trace(flows, packets, &trace, &first)?;
    let sizes: &[(usize, &str)] = match effort {
        Effort::Full => &[(100, "100"), (1_000, "1k"), (10_000, "10k")],
        Effort::Quick => &[(100, "100"), (1_000, "1k")],
    };
    for &(n, label) in sizes {
        let rules = dir.join(format!("{label}.rules"));
        std::fs::write(&rules, gen_rules(n)).map_err(|e| e.to_string())?;
        let ours = Tool::Flowstate.cost(dir, &trace, &first, &rules)?;
        let theirs = Tool::Suricata.cost(dir, &trace, &first, &rules)?;
        for (name, r) in [("ips", &ours), ("suricata", &theirs)] {
            report.metric(
                &format!("{name}_mpps_per_core_{label}"),
                packets as f64 / r.cpu_secs / 1e6,
            );
            report.metric(
                &format!("{name}_gbps_per_core_{label}"),
                bytes as f64 * 8.0 / r.cpu_secs / 1e9,
            );
            report.metric(&format!("{name}_cpu_secs_{label}"), r.cpu_secs);
            report.metric(&format!("{name}_alerts_{label}"), r.alerts as f64);
            report.metric(&format!("{name}_alert_pairs_{label}"), r.pairs.len() as f64);
        }
        report.metric(
            &format!("common_alert_pairs_{label}"),
            ours.pairs.intersection(&theirs.pairs).count() as f64,
        );
        report.ratio(
            &format!("ips_vs_suricata_{label}_rules"),
            theirs.cpu_secs / ours.cpu_secs,
        );
    }
    Ok(())
}

/// Writes the trace and a capture of its first packet; the trace's frame bytes.
fn write_trace(flows: usize, packets: usize, trace: &Path, first: &Path) -> Result<u64, String> {
    let cfg = SynthConfig {
        flows: flows as u64,
        packets: packets as u64,
        ..SynthConfig::new(Profile::Mixed)
    };
    let mut src = Synthetic::new(cfg).map_err(|e| e.to_string())?;
    let mut w = PcapWriter::create(trace).map_err(|e| e.to_string())?;
    let mut w1 = PcapWriter::create(first).map_err(|e| e.to_string())?;
    let mut batch = PacketBatch::new(256, 2048);
    let mut bytes = 0u64;
    let mut n = 0usize;
    loop {
        batch.clear();
        if src.recv(&mut batch).map_err(|e| e.to_string())? == 0 {
            break;
        }
        for (frame, meta) in batch.iter() {
            if n == 0 {
                w1.write_packet(frame, meta).map_err(|e| e.to_string())?;
            }
            w.write_packet(frame, meta).map_err(|e| e.to_string())?;
            bytes += u64::from(meta.wire_len);
            n += 1;
        }
    }
    w.finish().map_err(|e| e.to_string())?;
    w1.finish().map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// `n` rules (see the module documentation), sids 1..=n.
pub(crate) fn gen_rules(n: usize) -> String {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut word = |len: usize| -> String {
        (0..len)
            .map(|_| {
                let c = next(36) as u8;
                (if c < 10 { b'0' + c } else { b'a' + c - 10 }) as char
            })
            .collect()
    };
    let mut out = String::new();
    for sid in 1..=n {
        let line = match sid % 100 {
            // Rules the trace's application payloads match (`flowstate_io::synth`: HTTP on
            // 80/8080, TLS on 443, SSH on 22, SMTP on 25, DNS on 53, counter bytes on 3306/5432).
            0 => {
                let body = match (sid / 100) % 7 {
                    0 => "flow:to_server,established; content:\"GET \"; depth:4; content:\"HTTP/1.1|0d 0a|\"; distance:0;".to_owned(),
                    1 => "flow:to_client,established; content:\"200 OK\"; offset:9; depth:6;".to_owned(),
                    2 => "flow:to_server; content:\"|16 03|\"; depth:2; content:\"example.com\"; distance:0;".to_owned(),
                    3 => "content:\"SSH-2.0-OpenSSH\"; depth:15;".to_owned(),
                    4 => "content:\"|07|example|03|com|00|\"; nocase;".to_owned(),
                    5 => "flow:to_server,established; content:\"mail from|3a|\"; nocase;".to_owned(),
                    _ => {
                        // Counter bytes: a stream's byte s is s mod 256.
                        let k = (sid / 100 * 37) % 250;
                        format!(
                            "content:\"|{:02x} {:02x} {:02x} {:02x} {:02x}|\";",
                            k,
                            k + 1,
                            k + 2,
                            k + 3,
                            k + 4
                        )
                    }
                };
                let proto = if (sid / 100) % 7 == 4 { "udp" } else { "tcp" };
                format!("alert {proto} any any -> any any (msg:\"app {sid}\"; {body} sid:{sid};)")
            }
            1..=5 => format!(
                "alert tcp any any -> any any (msg:\"pair {sid}\"; flow:to_server,established; content:\"{}\"; content:\"{}\"; distance:0; within:64; sid:{sid};)",
                word(6),
                word(6)
            ),
            6..=9 => format!(
                "alert udp any any -> any 53 (msg:\"dns {sid}\"; content:\"|{}|\"; sid:{sid};)",
                word(4)
                    .bytes()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            _ => format!(
                "alert tcp any any -> any any (msg:\"word {sid}\"; content:\"{}\"; sid:{sid};)",
                word(8)
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// What one tool's runs cost and found.
struct Cost {
    /// CPU seconds on the trace beyond those of the one-packet run.
    cpu_secs: f64,
    /// EVE alert lines.
    alerts: usize,
    /// Distinct (sid, flow).
    pairs: BTreeSet<(u64, String)>,
}

#[derive(Debug, Clone, Copy)]
enum Tool {
    Flowstate,
    Suricata,
}

impl Tool {
    /// Runs the tool on `trace` and on `first`; the difference.
    fn cost(self, dir: &Path, trace: &Path, first: &Path, rules: &Path) -> Result<Cost, String> {
        let (full, eve) = self.run(dir, trace, rules, "full")?;
        let (base, _) = self.run(dir, first, rules, "first")?;
        let (alerts, pairs) = read_eve(&eve);
        Ok(Cost {
            cpu_secs: (full - base).max(1e-6),
            alerts,
            pairs,
        })
    }

    /// One run: its CPU seconds and its EVE file.
    fn run(
        self,
        dir: &Path,
        pcap: &Path,
        rules: &Path,
        tag: &str,
    ) -> Result<(f64, PathBuf), String> {
        let out = dir.join(format!("{self:?}-{tag}"));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
        let mut cmd = match self {
            Tool::Flowstate => {
                let config = out.join("ips.toml");
                std::fs::write(
                    &config,
                    format!(
                        "[input]\npcap = {:?}\n[output]\ndiscard = true\n[runtime]\nworkers = 1\n\
                         [[chain]]\nnf = \"ips\"\nrules = [{:?}]\n",
                        pcap.to_string_lossy(),
                        rules.to_string_lossy()
                    ),
                )
                .map_err(|e| e.to_string())?;
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let mut c = Command::new(exe);
                c.arg("run")
                    .arg(&config)
                    .arg("--eve")
                    .arg(out.join("eve.json"));
                c
            }
            Tool::Suricata => {
                let mut c = Command::new("suricata");
                c.args([
                    "-c",
                    "/etc/suricata/suricata.yaml",
                    "--runmode",
                    "single",
                    "-k",
                    "none",
                    "-r",
                ])
                .arg(pcap)
                .arg("-S")
                .arg(rules)
                .arg("-l")
                .arg(&out);
                c
            }
        };
        // The log to a file: a pipe nobody reads would stop the tool once full (alerts are
        // logged too).
        let log = out.join("stderr.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("{self:?}: {e}"))?;
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid value; wait4 fills it for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for the child spawned above (not waited for elsewhere).
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!(
                "{self:?} on {}: status {status}: {}",
                pcap.display(),
                err.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
            ));
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Ok((
            secs(usage.ru_utime) + secs(usage.ru_stime),
            out.join("eve.json"),
        ))
    }
}

/// The alert lines of an EVE file and their distinct (sid, flow) pairs.
fn read_eve(path: &Path) -> (usize, BTreeSet<(u64, String)>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut n = 0;
    let mut pairs = BTreeSet::new();
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event_type"] == "alert")
    {
        n += 1;
        let a = endpoint(&v["src_ip"], &v["src_port"]);
        let b = endpoint(&v["dest_ip"], &v["dest_port"]);
        let (x, y) = if a < b { (a, b) } else { (b, a) };
        pairs.insert((
            v["alert"]["signature_id"].as_u64().unwrap_or(0),
            format!("{} {x} {y}", v["proto"]),
        ));
    }
    (n, pairs)
}

/// An EVE endpoint as one text whatever the tool's address format (Suricata writes IPv6
/// addresses uncompressed, `2001:0db8:...`; we write RFC 5952's form).
fn endpoint(ip: &serde_json::Value, port: &serde_json::Value) -> String {
    let ip = ip.as_str().unwrap_or_default();
    let ip = ip
        .parse::<std::net::IpAddr>()
        .map_or_else(|_| ip.to_owned(), |a| a.to_string());
    format!("[{ip}]:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_rules_parse_with_unique_sids() {
        let text = gen_rules(1_000);
        let set = flowstate_nf::rules::parse("gen.rules", &text, &Default::default()).unwrap();
        assert_eq!(set.rules.len(), 1_000);
        let sids: BTreeSet<u32> = set.rules.iter().map(|r| r.sid).collect();
        assert_eq!(sids.len(), 1_000);
    }
}
