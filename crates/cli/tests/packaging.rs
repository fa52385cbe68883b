//! What operators install: every systemd unit of `packaging/systemd/` passes `systemd-analyze
//! verify` (with this build's binary standing in for `/usr/bin/flowstate`), and each starts
//! the command its role has, with options this binary takes.

use std::path::Path;
use std::process::Command;

const FLOWSTATE: &str = env!("CARGO_BIN_EXE_flowstate");

fn units() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd");
    let mut units: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "service"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    units.sort();
    units
}

#[test]
fn every_unit_verifies() {
    let units = units();
    let names: Vec<&str> = units.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "flowstate-controller.service",
            "flowstate-instance@.service",
            "flowstate-root.service",
            "flowstate-store.service"
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &units {
        std::fs::write(
            dir.path().join(name),
            text.replace("/usr/bin/flowstate", FLOWSTATE),
        )
        .unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(units.iter().map(|(n, _)| dir.path().join(n)))
        .output()
        .expect("systemd-analyze (scripts/setup installs systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
}

/// Each unit's command line is one this binary takes (`--help` after its options parses).
#[test]
fn every_unit_runs_a_command_of_this_binary() {
    for (name, text) in units() {
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=/usr/bin/flowstate "))
            .unwrap_or_else(|| panic!("{name}: no ExecStart of /usr/bin/flowstate"));
        let args: Vec<String> = exec
            .split_whitespace()
            .map(|a| {
                a.replace("%i", "3")
                    .replace("${FLOWSTATE_ADDRESS}", "192.0.2.13")
            })
            .collect();
        let out = Command::new(FLOWSTATE)
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: flowstate {args:?} --help: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
