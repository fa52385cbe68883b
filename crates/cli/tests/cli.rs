//! The command line as a user meets it: exit codes, messages, and what the commands produce.

use std::path::Path;
use std::process::{Command, Output};

fn flowstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(args)
        .output()
        .expect("run flowstate")
}

fn inspect_json(path: &Path) -> serde_json::Value {
    let out = flowstate(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

#[test]
fn gen_writes_exactly_the_packets_and_flows_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    for (profile, flows, packets) in [
        ("long", 3, 30_000),
        ("short", 200, 20_000),
        ("mixed", 150, 25_000),
        ("uniform", 1_000, 1_000),
    ] {
        let path = dir.path().join(format!("{profile}.pcap"));
        let out = flowstate(&[
            "gen",
            "--profile",
            profile,
            "--flows",
            &flows.to_string(),
            "--packets",
            &packets.to_string(),
            "--seed",
            "3",
            "-o",
            path.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = inspect_json(&path);
        assert_eq!(s["packets"], packets, "{profile}");
        assert_eq!(s["flows"], flows, "{profile}");
        assert_eq!(s["malformed"], 0, "{profile}");
        assert_eq!(s["bad_ip_checksums"], 0, "{profile}");
        assert_eq!(s["bad_transport_checksums"], 0, "{profile}");
        assert!(s["error"].is_null());
    }
}

#[test]
fn gen_scan_writes_the_ground_truth_beside_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scan.pcap");
    let out = flowstate(&[
        "gen",
        "--profile",
        "scan",
        "--flows",
        "500",
        "--packets",
        "20000",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = inspect_json(&path);
    assert_eq!(s["packets"], 20_000);
    assert_eq!(s["flows"], 500);
    assert_eq!(s["malformed"], 0);
    let truth = std::fs::read_to_string(dir.path().join("scan.pcap.truth.json")).unwrap();
    let truth: serde_json::Value = serde_json::from_str(&truth).expect("truth is JSON");
    assert_eq!(truth["profile"], "scan");
    let scanners = truth["scanners"].as_array().unwrap();
    assert_eq!(scanners.len(), 4);
    assert!(scanners.iter().all(|t| t["probes"] == 25));
}

#[test]
fn gen_is_deterministic_per_seed() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, seed: &str| {
        let path = dir.path().join(name);
        let out = flowstate(&[
            "gen",
            "--profile",
            "mixed",
            "--flows",
            "50",
            "--packets",
            "5000",
            "--seed",
            seed,
            "-o",
            path.to_str().unwrap(),
        ]);
        assert!(out.status.success());
        std::fs::read(path).unwrap()
    };
    assert_eq!(run("a.pcap", "1"), run("b.pcap", "1"));
    assert_ne!(run("c.pcap", "1"), run("d.pcap", "2"));
}

#[test]
fn damaged_capture_reports_offset_and_keeps_what_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.pcap");
    let out = flowstate(&[
        "gen",
        "--profile",
        "uniform",
        "--flows",
        "10",
        "--packets",
        "10",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let bytes = std::fs::read(&path).unwrap();
    // 24-byte header, then records of 16 + 60 bytes: cut the 4th record in half.
    let cut = 24 + 3 * 76 + 30;
    std::fs::write(&path, &bytes[..cut]).unwrap();
    let out = flowstate(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(!out.status.success(), "a damaged file is an error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("t.pcap") && stderr.contains(&(24 + 3 * 76).to_string()),
        "{stderr}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["packets"], 3, "the packets before the damage are counted");
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = flowstate(&["inspect", "/nonexistent/x.pcap"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.pcap"));

    let out = flowstate(&[
        "gen",
        "--profile",
        "bogus",
        "--flows",
        "1",
        "--packets",
        "1",
        "-o",
        "/tmp/x.pcap",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bogus") && err.contains("mixed"),
        "names the valid profiles: {err}"
    );

    let out = flowstate(&[
        "gen",
        "--profile",
        "short",
        "--flows",
        "100",
        "--packets",
        "10",
        "-o",
        "/tmp/x.pcap",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("packets"));

    let out = flowstate(&["bench", "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hashing"));
}

#[test]
fn bench_writes_the_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.json");
    let out = flowstate(&[
        "bench",
        "hashing",
        "--quick",
        "--json",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["name"], "hashing");
    for key in ["params", "metrics", "ratios", "machine"] {
        assert!(v[key].is_object(), "{key}");
    }
    let list = flowstate(&["bench", "--list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("hashing"));
}

#[test]
fn demo_runs_the_chain_with_state_at_work() {
    let out = flowstate(&["demo", "--flows", "500", "--packets", "20000", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("demo --json prints JSON");
    // Only the clients' packets of the 20,000 are generated (the reflect stage answers).
    let read = s["packets_in"].as_u64().unwrap();
    assert!((5_000..20_000).contains(&read), "{s}");
    assert_eq!(s["skipped"], 0, "{s}");
    assert_eq!(s["dropped_total"], 0, "nothing legitimate is dropped: {s}");
    assert!(s["reflected"].as_u64().unwrap() > 0, "the outside answers");
    // Mpps counts what the chain ran: the packets not skipped, and the answers.
    let ran = s["packets_in"].as_f64().unwrap() + s["reflected"].as_f64().unwrap()
        - s["skipped"].as_f64().unwrap();
    let mpps = s["mpps"].as_f64().unwrap();
    let wall = s["wall_s"].as_f64().unwrap();
    assert!(
        (mpps * wall * 1e6 - ran).abs() < 1.0,
        "{mpps} Mpps for {wall} s: {s}"
    );
    let nf = |name: &str| {
        s["nfs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        nf("firewall")["report"]["conns_opened"],
        500,
        "one connection per flow"
    );
    assert_eq!(
        nf("nat")["report"]["translations"],
        500,
        "one translation per flow"
    );
    // The demo's flow cache forwards established flows' packets past the NFs: each packet
    // either took it or was translated by the NAT (an answer back, a client's packet out).
    let cached = s["flow_cache"].as_u64().unwrap_or(0);
    assert!(cached > 0, "the flow cache carries established flows: {s}");
    let nat = &nf("nat")["report"];
    assert_eq!(
        nat["packets_in"].as_u64().unwrap() + nat["packets_out"].as_u64().unwrap() + cached,
        read + s["reflected"].as_u64().unwrap(),
        "every packet through the NAT or the cache: {s}"
    );
    let lb = nf("lb")["labelled"].as_array().unwrap().clone();
    let spread: Vec<u64> = ["192.0.2.11:443", "192.0.2.12:443", "192.0.2.13:443"]
        .iter()
        .map(|b| {
            let e = lb
                .iter()
                .find(|e| e["name"] == "backend_connections" && e["value"] == *b)
                .unwrap_or_else(|| panic!("{b} in {lb:?}"));
            assert_eq!(e["label"], "backend");
            e["count"].as_u64().unwrap()
        })
        .collect();
    assert!(
        spread.iter().all(|&n| n > 0),
        "every backend gets connections: {spread:?}"
    );
    let (lo, hi) = (spread.iter().min().unwrap(), spread.iter().max().unwrap());
    assert!(hi - lo <= 2, "least-loaded spreads evenly: {spread:?}");
}

/// A reader that goes away (`flowstate ... | head`) ends a printing command quietly: no panic
/// on the failed write (issue #20: `inspect --json | head` and `bench --list | head` panicked).
#[test]
fn a_closed_pipe_ends_printing_commands_quietly() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("t.pcap");
    let out = flowstate(&[
        "gen",
        "--profile",
        "mixed",
        "--flows",
        "20",
        "--packets",
        "500",
        "-o",
        pcap.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    for args in [
        vec!["bench", "--list"],
        vec!["inspect", pcap.to_str().unwrap(), "--json"],
    ] {
        // A pipe whose reader is gone before the child starts, so that its first write fails
        // (with `Stdio::piped()` the child could write into the pipe's buffer before the
        // reader was dropped, and end well).
        let mut fds = [0; 2];
        // SAFETY: pipe writes two new descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just made and are owned by nothing else.
        let (reader, writer) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(reader);
        let mut child = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(
            status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {status:?} {stderr}"
        );
    }
}

/// The repository's root, where the examples are run from (their paths are relative to it).
fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `flowstate ARGS` run from the repository's root.
fn flowstate_at_root(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("run flowstate")
}

#[test]
fn check_passes_every_example_and_says_what_it_would_run() {
    let mut examples: Vec<String> = std::fs::read_dir(repo_root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| format!("examples/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    examples.sort();
    assert!(examples.len() >= 20, "{examples:?}");
    // A data file beside the repository (examples/hypersfc.toml's prefix set), or one a
    // script makes (.run/tls of scripts/tls-certs, examples/nat-redis-tls.toml), is not on
    // every machine: without it, check must say which file and key, and nothing else.
    let missing = |e: &str| -> Option<String> {
        let text = std::fs::read_to_string(repo_root().join(e)).unwrap();
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| Some(l.split('"').nth(1)?.to_owned()))
            .find(|p| {
                (p.starts_with("../") || p.starts_with(".run/")) && !repo_root().join(p).exists()
            })
    };
    let (present, absent): (Vec<&String>, Vec<&String>) =
        examples.iter().partition(|e| missing(e).is_none());
    for e in &absent {
        let out = flowstate_at_root(&["check", e]);
        let stdout = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        let file = missing(e).unwrap();
        assert!(!out.status.success(), "{e}: {stdout}");
        assert!(
            stdout.contains(&format!("{file}: No such file"))
                && stdout.contains(&format!("{e}: 1 error")),
            "{e}: {stdout}"
        );
    }
    let mut args = vec!["check"];
    args.extend(present.iter().map(|s| s.as_str()));
    let out = flowstate_at_root(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for e in &present {
        assert!(stdout.contains(&format!("{e}: ok")), "{e}: {stdout}");
    }
    for e in &examples {
        // The header names the file and the command that runs it.
        let text = std::fs::read_to_string(repo_root().join(e)).unwrap();
        let first = text.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("# {e} — run: ")) && first.ends_with(e.as_str()),
            "{e}: {first}"
        );
    }
    let out = flowstate_at_root(&[
        "check",
        "--json",
        "examples/nat.toml",
        "examples/cluster.toml",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["ok"], true);
    assert_eq!(v[0]["summary"]["chain"], "nat");
    assert_eq!(v[0]["summary"]["state"], "local, flush every 1ms");
    assert_eq!(
        v[0]["summary"]["workers"],
        "2, reflect (the outside hosts answer)"
    );
    assert_eq!(v[1]["summary"]["chain"], "firewall -> nat");
    assert!(v[1]["summary"]["cluster"]
        .as_str()
        .unwrap()
        .starts_with("16 partitions, 2 instances"));
}

/// A duration too long for any timer (it would overflow the clock it is added to) is refused by
/// `check` and by `run`, naming the key; nothing panics.
#[test]
fn a_duration_beyond_the_longest_is_refused_by_check_and_run() {
    let dir = tempfile::tempdir().unwrap();
    for (section, key) in [
        ("[state]\nbackend = \"store\"\ntimeout", "state.timeout"),
        (
            "[[chain]]\nnf = \"nat\"\nexternal = [\"203.0.113.1\"]\nudp",
            "chain[0].nat.udp",
        ),
        ("[cluster]\nheartbeat", "cluster.heartbeat"),
        ("[cluster]\nmove_timeout", "cluster.move_timeout"),
    ] {
        let path = dir.path().join("long.toml");
        std::fs::write(
            &path,
            format!(
                "[input]\nsynthetic = {{ profile = \"mixed\", flows = 10 }}\n\n{section} = \"584542046090y\"\n"
            ),
        )
        .unwrap();
        let file = path.to_str().unwrap();
        for action in ["check", "run"] {
            let out = flowstate(&[action, file]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                matches!(out.status.code(), Some(1 | 2)),
                "{action} {key}: {:?} {err}",
                out.status
            );
            assert!(
                err.contains(&format!(
                    "{key}: \"584542046090y\" is longer than the longest"
                )),
                "{action} {key}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

/// A file that never ends (`/dev/zero`) given as the deployment or as a rule set is refused
/// once it passes 64 MiB, naming it; memory stays bounded.
#[test]
fn an_endless_file_is_refused_not_read_into_memory() {
    let out = flowstate(&["check", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/dev/zero: cannot read: larger than 64 MiB"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ips.toml");
    std::fs::write(
        &path,
        "[input]\nsynthetic = { profile = \"mixed\", flows = 10 }\n\n\
         [[chain]]\nnf = \"ips\"\nrules = [\"/dev/zero\"]\n",
    )
    .unwrap();
    let out = flowstate(&["check", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("chain[0].ips.rules: cannot read /dev/zero: larger than 64 MiB"),
        "{err}"
    );
}

#[test]
fn check_reports_every_error_of_a_file_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        r#"[input]
synthetic = { profile = "mixed", flows = 100, clients_v4 = "10.0.0.1/8" }

[runtime]
workers = 0

[state]
backend = "store"
timeout = 500

[[chain]]
nf = "nat"
external = ["203.0.113.1"]
udp = 300

[cluster]
heartbeat = 50
"#,
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let out = flowstate(&["check", file]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{file}:2: input.synthetic.clients_v4: 10.0.0.1/8: host bits set; did you mean 10.0.0.0/8?"),
            format!("{file}:5: runtime.workers: expected 1 to 1024, got 0"),
            format!("{file}:9: state.timeout: write a duration with its unit, e.g. \"500ms\""),
            format!("{file}:14: chain[0].nat.udp: write a duration with its unit, e.g. \"300s\""),
            format!("{file}:17: cluster.heartbeat: write a duration with its unit, e.g. \"50s\""),
            format!("{file}: 5 errors"),
        ],
        "{err}"
    );

    // The same as JSON, and `run` refuses the file with the same errors.
    let out = flowstate(&["check", "--json", file]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["ok"], false);
    let keys: Vec<&str> = v[0]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "input.synthetic.clients_v4",
            "runtime.workers",
            "state.timeout",
            "chain[0].nat.udp",
            "cluster.heartbeat"
        ]
    );
    assert_eq!(v[0]["errors"][3]["line"], 14);
    let out = flowstate(&["run", file]);
    assert_eq!(out.status.code(), Some(1));
    let run_err = String::from_utf8_lossy(&out.stderr);
    assert!(run_err.contains(lines[3]), "{run_err}");
    assert!(run_err.contains(lines[0]), "{run_err}");

    // A syntax error is the one error; a missing file is an error too.
    std::fs::write(&path, "[input]\nsynthetic = {\n").unwrap();
    let out = flowstate(&["check", file]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.ends_with(&format!("{file}: 1 error\n")), "{err}");
    let out = flowstate(&["check", "examples/nowhere.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn check_refuses_a_worker_private_nat_table_in_a_cluster_naming_the_key() {
    let example = std::fs::read_to_string(repo_root().join("examples/cluster.toml")).unwrap();
    let nat = "nf = \"nat\"\n";
    assert!(example.contains(nat), "examples/cluster.toml has a NAT");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster-mvt.toml");
    std::fs::write(
        &path,
        example.replace(nat, "nf = \"nat\"\ntable = \"mvt\"\n"),
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let out = flowstate(&["check", "--json", file]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors = v[0]["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["key"], "chain[1].nat.table");
    let line = example.lines().position(|l| l == "nf = \"nat\"").unwrap() + 2;
    assert_eq!(errors[0]["line"], line as u64);
    let reason = errors[0]["reason"].as_str().unwrap();
    assert!(reason.contains("worker-private"), "{reason}");

    // The same NAT on one box is fine.
    let mut one_box: toml::Table =
        toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    one_box.remove("cluster");
    std::fs::write(&path, toml::to_string(&one_box).unwrap()).unwrap();
    let out = flowstate(&["check", file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The subcommands a `--help` lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // A name is indented by two spaces; deeper lines continue a description.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_command_s_help_has_examples() {
    // Every command and subcommand `flowstate --help` leads to, found by walking the tree.
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen: Vec<String> = Vec::new();
    while let Some(path) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = flowstate(&args);
        let name = format!("flowstate {}", path.join(" "));
        assert!(
            out.status.success(),
            "{name} --help: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let help = String::from_utf8(out.stdout).expect("UTF-8 help");
        let examples = help
            .split_once("Examples:\n")
            .map(|(_, e)| e)
            .unwrap_or_else(|| panic!("{name} --help has no \"Examples:\":\n{help}"));
        assert!(
            examples.contains("flowstate "),
            "{name} --help: its examples show no flowstate command:\n{help}"
        );
        for sub in subcommands(&help) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        seen.push(path.join(" "));
    }
    for expected in [
        "",
        "demo",
        "run",
        "check",
        "gen",
        "inspect",
        "bench",
        "report",
        "lab",
        "store",
        "store stats",
        "cluster",
        "cluster up",
        "cluster down",
        "cluster status",
        "cluster scale",
        "cluster drain",
        "cluster kill",
        "state",
        "state list",
        "top",
        "reload",
    ] {
        assert!(
            seen.iter().any(|s| s == expected),
            "`flowstate {expected} --help` was not reached; seen: {seen:?}"
        );
    }
}
