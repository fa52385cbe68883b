//! `flowstate run` end to end: every example as a user runs it, the same results on 1 and 2
//! workers, and the NAT's output checked by tshark.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn flowstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run flowstate")
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = flowstate(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("run --json prints JSON")
}

fn nf_report(s: &serde_json::Value, name: &str) -> serde_json::Value {
    s["nfs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .unwrap()["report"]
        .clone()
}

#[test]
fn every_example_runs_from_the_repository_root() {
    for example in [
        "nat", "nat-mvt", "firewall", "lb", "chain", "portscan", "ips",
    ] {
        let path = format!("examples/{example}.toml");
        let s = run_json(&["run", &path, "--json"]);
        let total_in = s["packets_in"].as_u64().unwrap() + s["reflected"].as_u64().unwrap();
        let total_out = s["packets_out"].as_u64().unwrap()
            + s["dropped_total"].as_u64().unwrap()
            + s["skipped"].as_u64().unwrap();
        assert_eq!(total_in, total_out, "{example}: every packet accounted for");
        assert!(s["packets_out"].as_u64().unwrap() > 0, "{example}: {s}");
        let text = flowstate(&["run", &path]);
        assert!(text.status.success());
        assert!(String::from_utf8_lossy(&text.stdout).contains("packets out"));
    }
}

/// `examples/ips.toml`: its rules find what the `trojan` trace's hosts do, each rule once per
/// flow, the same with one worker and two.
#[test]
fn the_ips_example_alerts_on_the_trojan_trace() {
    let mut counts = Vec::new();
    for workers in ["1", "2"] {
        let s = run_json(&["run", "examples/ips.toml", "--json", "--workers", workers]);
        let r = nf_report(&s, "ips");
        counts.push(r["alerts"].as_u64().unwrap());
        assert_eq!(r["blocked_packets"], 0, "no traversal in the trace: {r}");
    }
    assert_eq!(counts[0], counts[1]);
    // SSH banners, IRC registrations, FTP downloads of executables, HTTP by curl.
    assert!(counts[0] >= 50, "{counts:?}");
}

#[test]
fn one_and_two_workers_agree() {
    let one = run_json(&["run", "examples/chain.toml", "--json", "--workers", "1"]);
    let two = run_json(&["run", "examples/chain.toml", "--json", "--workers", "2"]);
    for key in [
        "packets_in",
        "reflected",
        "packets_out",
        "dropped_total",
        "skipped",
    ] {
        assert_eq!(one[key], two[key], "{key}");
    }
    for (nf, key) in [
        ("firewall", "conns_opened"),
        ("firewall", "allowed"),
        ("nat", "translations"),
        ("nat", "packets_in"),
        ("nat", "packets_out"),
        ("lb", "flows"),
    ] {
        assert_eq!(
            nf_report(&one, nf)[key],
            nf_report(&two, nf)[key],
            "{nf}.{key}"
        );
    }
}

/// The portscan example finds its four scanners: exactly once each on one worker; on two,
/// an outside scanner may be found once per partition its targets fall in (the detector
/// partitions by the inside address, see `flowstate_nf::portscan`).
#[test]
fn portscan_example_reports_the_scanners() {
    let one = run_json(&["run", "examples/portscan.toml", "--json", "--workers", "1"]);
    let r = nf_report(&one, "portscan");
    assert_eq!(r["alerts_scanner"], 4, "{r}");
    assert!(r["dropped_blocked"].as_i64().unwrap() > 0, "{r}");
    let two = run_json(&["run", "examples/portscan.toml", "--json", "--workers", "2"]);
    let r = nf_report(&two, "portscan");
    // Inside scanners are exact on any number of workers; an outside one is walked per
    // partition its targets fall in.
    assert_eq!(r["alerts_scanner_outbound"], 2, "{r}");
    let n = r["alerts_scanner_inbound"].as_i64().unwrap();
    assert!((2..=4).contains(&n), "{r}");
    assert_eq!(r["alerts_scanner"].as_i64().unwrap(), 2 + n);
    // A bad key is named.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ps.toml");
    std::fs::write(
        &path,
        "[input]\nsynthetic = { profile = \"scan\" }\n[[chain]]\nnf = \"portscan\"\ntheta1 = 0.9\n",
    )
    .unwrap();
    let out = flowstate(&["run", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ps.toml") && err.contains("theta1"), "{err}");
}

#[test]
fn bad_config_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[input]\nsynthetic = { profile = \"mixed\" }\n[[chain]]\nnf = \"nat\"\nexternal = [\"203.0.113.1\"]\nports = \"9-1\"\n").unwrap();
    let out = flowstate(&["run", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("ports"), "{err}");
}

/// The NAT over a generated capture, answers played by the reflect stage; tshark checks every
/// output packet's checksums and that inside addresses never leave and the outside only ever
/// sees the external address.
#[test]
fn nat_output_is_checksum_correct_and_translated_per_tshark() {
    if !flowstate_testkit::tshark_or_skip(
        "nat_output_is_checksum_correct_and_translated_per_tshark",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let output = dir.path().join("out.pcap");
    let gen = flowstate(&[
        "gen",
        "--profile",
        "mixed",
        "--flows",
        "300",
        "--packets",
        "20000",
        "--ipv6-share",
        "0",
        "--seed",
        "5",
        "-o",
        input.to_str().unwrap(),
    ]);
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let config = dir.path().join("nat.toml");
    std::fs::write(
        &config,
        format!(
            "[input]\npcap = {:?}\noutbound_only = true\n[output]\npcap = {:?}\n[runtime]\nworkers = 2\ninside = [\"10.0.0.0/8\"]\nreflect = true\n[[chain]]\nnf = \"nat\"\nexternal = [\"203.0.113.1\"]\nports = \"20000-29999\"\n",
            input, output
        ),
    )
    .unwrap();
    let s = run_json(&["run", config.to_str().unwrap(), "--json"]);
    assert_eq!(s["dropped_total"], 0, "{s}");
    assert_eq!(nf_report(&s, "nat")["translations"], 300);

    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&output)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
        ])
        .args([
            "-T",
            "fields",
            "-E",
            "separator=,",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
        ])
        .args([
            "-e",
            "ip.checksum.status",
            "-e",
            "tcp.checksum.status",
            "-e",
            "udp.checksum.status",
        ])
        .args([
            "-e",
            "tcp.srcport",
            "-e",
            "udp.srcport",
            "-e",
            "tcp.dstport",
            "-e",
            "udp.dstport",
        ])
        .output()
        .expect("tshark");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len() as u64, s["packets_out"].as_u64().unwrap());
    let (mut outbound, mut inbound) = (0, 0);
    for r in &rows {
        assert_eq!(r[2], "1", "ip checksum good: {r:?}");
        assert!(r[3] == "1" || r[4] == "1", "transport checksum good: {r:?}");
        let port = |a: &str, b: &str| a.parse::<u16>().or_else(|_| b.parse()).unwrap();
        if r[0] == "203.0.113.1" {
            outbound += 1;
            assert!(!r[1].starts_with("10."), "{r:?}");
            assert!(
                (20000..30000).contains(&port(r[5], r[6])),
                "source port from the pool: {r:?}"
            );
        } else {
            inbound += 1;
            assert!(
                r[1].starts_with("10.") && !r[0].starts_with("10."),
                "translated back to the inside: {r:?}"
            );
        }
    }
    assert_eq!(
        inbound,
        s["reflected"].as_u64().unwrap(),
        "every answer translated back"
    );
    assert!(outbound > inbound);
}

/// `examples/hypersfc.toml` (HyperSFC's ten tables over the real prefix set): busy, lazy and
/// lazy-p submit write the same packets, every packet is accounted for, the load balancer's
/// rewritten web flows reach its backends with checksums tshark finds good, and lazy submit
/// circulates less than busy.
#[test]
fn the_hypersfc_example_gives_one_output_in_every_submit_mode() {
    if !root().join("../shared/data/ipv4-prefixes.tsv").exists() {
        eprintln!("skipped: ../shared/data/ipv4-prefixes.tsv not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(root().join("examples/hypersfc.toml")).unwrap();
    let example = example
        .replace(
            "flows = 20000, packets = 400000",
            "flows = 2000, packets = 40000",
        )
        .replace("discard = true", "# discard");
    let mut outputs = Vec::new();
    let mut circulations = Vec::new();
    for mode in ["busy", "lazy", "lazy-p"] {
        let out = dir.path().join(format!("{mode}.pcap"));
        let text = example
            .replace("mode = \"lazy\"", &format!("mode = {mode:?}"))
            .replace("# pcap = \"hypersfc-out.pcap\"", &format!("pcap = {out:?}"));
        assert!(text.contains(&format!("mode = {mode:?}")) && text.contains("pcap ="));
        let config = dir.path().join(format!("{mode}.toml"));
        std::fs::write(&config, text).unwrap();
        let s = run_json(&["run", config.to_str().unwrap(), "--json"]);
        assert_eq!(s["mode"], mode, "{s}");
        let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
        assert_eq!(n("packets_in"), 40_000);
        assert_eq!(n("packets_in"), n("packets_out") + n("dropped"), "{s}");
        assert!(n("dropped") > 0 && n("fast_path_only") > 0, "{s}");
        circulations.push(n("circulations"));
        outputs.push(std::fs::read(&out).unwrap());
    }
    assert!(outputs[0].len() > 1000);
    assert!(
        outputs[1] == outputs[0] && outputs[2] == outputs[0],
        "the modes disagree"
    );
    assert!(
        circulations[1] < circulations[0],
        "lazy {} vs busy {}",
        circulations[1],
        circulations[0]
    );
    // The LB's backends as destinations, checksums as tshark computes them.
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(dir.path().join("lazy.pcap"))
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
        ])
        .args([
            "-o",
            "udp.check_checksum:TRUE",
            "-T",
            "fields",
            "-E",
            "separator=,",
        ])
        .args([
            "-e",
            "ip.dst",
            "-e",
            "tcp.dstport",
            "-e",
            "ip.checksum.status",
        ])
        .args(["-e", "tcp.checksum.status", "-e", "udp.checksum.status"])
        .output()
        .expect("tshark");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut to_backends = 0;
    for row in text.lines() {
        let f: Vec<&str> = row.split(',').collect();
        assert!(
            f[2..].iter().all(|c| *c != "0"), // 0: bad, 1: good, 2: unverified
            "a bad checksum: {row}"
        );
        if f[0].starts_with("1.0.0.1") && f[1] == "8080" {
            to_backends += 1;
        }
    }
    assert!(
        to_backends > 1000,
        "{to_backends} packets to the LB's backends"
    );
}

/// `-v` adds the runtime's start line to stderr, `--log-format json` makes every line a JSON
/// object, `-q` leaves only errors; without them (and without RUST_LOG) the run logs nothing.
#[test]
fn log_flags_choose_what_stderr_shows() {
    let stderr = |flags: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(flags)
            .args(["run", "examples/nat.toml"])
            .current_dir(root())
            .env_remove("RUST_LOG")
            .output()
            .expect("run flowstate");
        assert!(out.status.success(), "{flags:?}");
        String::from_utf8(out.stderr).expect("stderr is UTF-8")
    };
    assert!(!stderr(&[]).contains("run starting"));
    assert!(!stderr(&["-q"]).contains("run starting"));
    assert!(stderr(&["-v"]).contains("run starting"));
    let json = stderr(&["-v", "--log-format", "json"]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let start = lines
        .iter()
        .find(|l| l["fields"]["message"] == "run starting")
        .unwrap_or_else(|| panic!("no start line in {json}"));
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["fields"]["backend"], "local");
    let both = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["-q", "-v", "run", "examples/nat.toml"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!both.status.success(), "-q and -v contradict each other");
}

/// `examples/firewall.toml` checks TCP windows (`liberal = false`): its synthetic trace has
/// exact sequence numbers, so nothing is dropped for them, and it drops what the liberal
/// firewall drops, no more.
#[test]
fn the_firewall_example_checks_windows_and_drops_nothing_for_them() {
    let example = std::fs::read_to_string(root().join("examples/firewall.toml")).unwrap();
    assert!(example.contains("liberal = false"));
    let strict = nf_report(
        &run_json(&["run", "examples/firewall.toml", "--json"]),
        "firewall",
    );
    let dir = tempfile::tempdir().unwrap();
    let liberal = dir.path().join("liberal.toml");
    std::fs::write(
        &liberal,
        example.replace("liberal = false", "liberal = true"),
    )
    .unwrap();
    let liberal = nf_report(
        &run_json(&["run", liberal.to_str().unwrap(), "--json"]),
        "firewall",
    );
    for key in [
        "denied_tcp_seq_above_window",
        "denied_tcp_ack_above_data_seen",
        "denied_tcp_rst_out_of_window",
        "allowed_tcp_ignored",
    ] {
        assert!(strict.get(key).is_none(), "{key}: {strict}");
    }
    assert!(
        strict["allowed_tracked"].as_i64().unwrap() > 50_000,
        "{strict}"
    );
    assert_eq!(strict["allowed"], liberal["allowed"]);
    assert_eq!(strict["denied"], liberal["denied"]);
}
