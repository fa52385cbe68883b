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
    assert_eq!(s["packets_in"], 20000);
    assert_eq!(s["dropped_total"], 0, "nothing legitimate is dropped: {s}");
    assert!(s["reflected"].as_u64().unwrap() > 0, "the outside answers");
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
    assert_eq!(
        nf("nat")["report"]["packets_in"],
        s["reflected"],
        "every answer is translated back"
    );
    let lb = nf("lb")["report"].clone();
    let spread: Vec<u64> = ["192.0.2.11:443", "192.0.2.12:443", "192.0.2.13:443"]
        .iter()
        .map(|b| lb[format!("{b} connections")].as_u64().unwrap())
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
