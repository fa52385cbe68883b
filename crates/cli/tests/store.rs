//! `flowstate store` and the `store` backend end to end: the server binary, `flowstate run`
//! with `backend = "store"`, and the same packets out as with the embedded store.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `flowstate store` process, killed when dropped.
struct StoreProcess {
    child: Child,
    addr: String,
}

impl StoreProcess {
    fn start(extra: &[&str]) -> StoreProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(["store", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start flowstate store");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit(' ')
            .next()
            .expect("the store prints its address")
            .to_owned();
        assert!(addr.contains(':'), "{line:?}");
        StoreProcess { child, addr }
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of a configuration outside its `[state]` table.
fn outside_state(text: &str) -> Vec<&str> {
    let mut in_state = false;
    text.lines()
        .filter(|l| {
            let t = l.trim();
            if t.starts_with('[') {
                in_state = t == "[state]";
            }
            !in_state
        })
        .collect()
}

fn run(config: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", config.to_str().unwrap(), "--json"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn nat_on_the_store_sends_the_same_packets_as_on_the_embedded_store() {
    let local = std::fs::read_to_string(root().join("examples/nat.toml")).unwrap();
    let store = std::fs::read_to_string(root().join("examples/nat-store.toml")).unwrap();
    assert_eq!(
        outside_state(&local),
        outside_state(&store),
        "examples/nat-store.toml differs from examples/nat.toml only under [state]"
    );
    let server = StoreProcess::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for (name, text) in [("local", &local), ("store", &store)] {
        let out = dir.path().join(format!("{name}.pcap"));
        let text = text
            .replace(
                "discard = true",
                &format!("pcap = {:?}", out.to_str().unwrap()),
            )
            .replace("127.0.0.1:7878", &server.addr);
        assert!(text.contains(".pcap"));
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let summary = run(&cfg);
        assert_eq!(summary["backend"], name);
        assert!(summary["packets_out"].as_u64().unwrap() > 0);
        outputs.push(packets(&std::fs::read(&out).unwrap()));
    }
    assert!(outputs[0].len() > 1000);
    assert_eq!(outputs[0].len(), outputs[1].len());
    // Two workers interleave their output differently from run to run (on either store), and
    // pcap timestamps are taken when written: compare every packet's bytes, in a fixed order.
    assert!(
        outputs[0] == outputs[1],
        "the NAT's output packets differ between the embedded store and the store server"
    );
}

/// The packets of a classic pcap file, each byte for byte, sorted.
fn packets(pcap: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(pcap[at + 16..at + 16 + len].to_vec());
        at += 16 + len;
    }
    assert_eq!(at, pcap.len(), "whole pcap records");
    out.sort_unstable();
    out
}

#[test]
fn every_nf_runs_on_the_store() {
    let server = StoreProcess::start(&["--token", "s3cret"]);
    let dir = tempfile::tempdir().unwrap();
    for example in ["firewall", "lb", "chain"] {
        let text =
            std::fs::read_to_string(root().join(format!("examples/{example}.toml"))).unwrap();
        let text = text.replace(
            "backend = \"local\"",
            &format!(
                "backend = \"store\"\nurl = {:?}\ntoken = \"s3cret\"",
                server.addr
            ),
        );
        assert!(text.contains("backend = \"store\""), "{example}");
        let cfg = dir.path().join(format!("{example}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let s = run(&cfg);
        assert_eq!(s["backend"], "store");
        let total_in = s["packets_in"].as_u64().unwrap() + s["reflected"].as_u64().unwrap();
        let total_out = s["packets_out"].as_u64().unwrap()
            + s["dropped_total"].as_u64().unwrap()
            + s["skipped"].as_u64().unwrap();
        assert_eq!(total_in, total_out, "{example}: every packet accounted for");
        assert!(s["packets_out"].as_u64().unwrap() > 0, "{example}");
    }
}

#[test]
fn a_wrong_token_is_a_clear_error() {
    let server = StoreProcess::start(&["--token", "right"]);
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/nat-store.toml"))
        .unwrap()
        .replace("127.0.0.1:7878", &server.addr)
        .replace("# token = \"...\"", "token = \"wrong\"");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unauthorized") || err.contains("token"),
        "{err}"
    );
}
