//! The `trojan` profile: deterministic, every frame dissects with verified checksums, the
//! ground truth names hosts of the trace, and tshark dissects its HTTP, SSH, FTP, FTP-DATA and
//! IRC without a malformed packet.

mod synth_common;

use flowstate_io::pcap::PcapWriter;
use flowstate_io::synth::{infected, Profile, SynthConfig};
use flowstate_io::{PacketBatch, Sink};
use flowstate_wire::dissect;
use flowstate_wire::dissect::verify_checksums;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use synth_common::generate;

fn cfg(hosts: u64, seed: u64) -> SynthConfig {
    SynthConfig {
        flows: hosts,
        seed,
        ..SynthConfig::new(Profile::Trojan)
    }
}

#[test]
fn deterministic_valid_and_with_its_ground_truth() {
    let c = cfg(40, 9);
    let a = generate(&c);
    assert_eq!(a, generate(&c), "same seed, same bytes");
    assert_ne!(a, generate(&cfg(40, 10)));
    let truth = infected(&c);
    assert_eq!(truth.len(), 4, "one host in ten");
    let mut inside = BTreeSet::new();
    let mut last = 0;
    for (f, m) in &a {
        assert!(m.timestamp_ns >= last, "in time order");
        last = m.timestamp_ns;
        let d = dissect(f).expect("dissects");
        let s = verify_checksums(f, &d);
        assert_eq!((s.ip, s.transport), (Some(true), Some(true)));
        let k = d.flow.expect("flow");
        if matches!(k.src, IpAddr::V4(a) if a.octets()[0] == 10) {
            inside.insert(k.src);
        }
    }
    assert_eq!(inside.len(), 40, "every host sends");
    assert!(truth.iter().all(|h| inside.contains(h)));
    assert!("trojan".parse::<Profile>().is_ok());
    assert!(cfg(0, 1).validate().is_err());
}

#[test]
fn tshark_dissects_it_without_malformed_packets() {
    if !flowstate_testkit::tshark_or_skip("tshark_dissects_it_without_malformed_packets") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.pcap");
    let mut w = PcapWriter::create(&path).unwrap();
    let mut b = PacketBatch::new(1, 2048);
    for (f, m) in generate(&cfg(50, 1)) {
        b.clear();
        b.push(&f, m);
        w.send(&b).unwrap();
    }
    w.finish().unwrap();
    let tshark = |filter: &str, field: &str| {
        let out = Command::new("tshark")
            .args([
                "-r",
                path.to_str().unwrap(),
                "-Y",
                filter,
                "-T",
                "fields",
                "-e",
                field,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        tshark(
            "_ws.malformed || _ws.expert.severity == error",
            "frame.number"
        ),
        ""
    );
    let retr = tshark("ftp.request.command == \"RETR\"", "ftp.request.arg");
    assert!(retr
        .lines()
        .any(|l| l.ends_with(".zip") || l.ends_with(".exe") || l.ends_with(".html")));
    assert!(
        !tshark("ftp-data", "frame.number").is_empty(),
        "data connections tied to PASV"
    );
    assert!(tshark("irc.request", "irc.request.command").contains("JOIN"));
    assert!(tshark("ssh.protocol", "ssh.protocol").contains("SSH-2.0-"));
    assert!(!tshark("http.response.code == 200", "frame.number").is_empty());
}
