//! The trojan detector end to end: `examples/trojan.toml` runs as it is and alerts (in the
//! `--eve` file) on exactly the infected hosts that `gen --profile trojan` lists in its
//! ground-truth side file.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_example_alerts_on_the_ground_truth() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("t.pcap");
    // The example's trace: 50 hosts, seed 1.
    let gen = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args([
            "gen",
            "--profile",
            "trojan",
            "--flows",
            "50",
            "--seed",
            "1",
            "-o",
        ])
        .arg(&pcap)
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("t.pcap.truth.json"))
        .expect("gen writes the ground truth beside the capture");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let truth: Vec<String> = json["infected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(truth.len(), 5);

    let eve = dir.path().join("eve.json");
    let run = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", "examples/trojan.toml", "--json", "--eve"])
        .arg(&eve)
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let s: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let nf = s["nfs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "trojan")
        .unwrap();
    assert_eq!(nf["report"]["alerts"], 5, "{s}");
    // The EVE file has one alert a line, naming exactly the infected hosts.
    let mut hosts: Vec<String> = std::fs::read_to_string(&eve)
        .expect("--eve writes the alerts")
        .lines()
        .map(|l| {
            let a: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(a["event_type"], "alert", "{l}");
            assert_eq!(
                a["alert"]["signature"], "trojan: ssh, ftp download, irc",
                "{l}"
            );
            a["trojan"]["host"].as_str().unwrap().to_owned()
        })
        .collect();
    hosts.sort();
    let mut want = truth.clone();
    want.sort();
    assert_eq!(hosts, want, "{stderr}");
}
