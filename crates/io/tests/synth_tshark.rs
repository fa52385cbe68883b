//! tshark dissects the application data of generated traces (issue #17: `mixed`, `scan`,
//! `short`, `long`) without a malformed packet or an error, and finds the DNS queries and answers, HTTP requests and responses
//! (with their Content-Length) and TLS hellos that an independent parse of the same trace
//! counts (`synth_common::app`).
//!
//! Skipped, with a line saying so, only when `tshark` is not on PATH and `CI` is unset; in CI a
//! missing tshark fails the test.

mod synth_common;

use flowstate_io::pcap::PcapWriter;
use flowstate_io::synth::{Profile, SynthConfig};
use flowstate_io::{PacketBatch, PacketMeta, Sink};
use flowstate_testkit::tshark_or_skip;
use flowstate_wire::FlowKey;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use synth_common::{app, generate, parse, Pkt};

fn write_pcap(path: &Path, packets: &[(Vec<u8>, PacketMeta)]) {
    let mut w = PcapWriter::create(path).expect("create pcap");
    let mut batch = PacketBatch::new(64, 2048);
    for chunk in packets.chunks(64) {
        batch.clear();
        for (b, m) in chunk {
            assert!(batch.push(b, *m));
        }
        w.send(&batch).expect("write");
    }
    w.finish().expect("finish");
}

/// What the trace holds, by our own parse of each flow.
#[derive(Debug, Default, PartialEq, Eq)]
struct Expected {
    dns_queries: usize,
    dns_answers: usize,
    http_requests: usize,
    http_responses: usize,
    http_bodies: Vec<usize>,
    client_hellos: usize,
    server_hellos: usize,
}

fn expected(packets: &[(Vec<u8>, PacketMeta)]) -> Expected {
    let mut flows: BTreeMap<FlowKey, Vec<Pkt>> = BTreeMap::new();
    for (bytes, _) in packets {
        let p = parse(bytes);
        flows.entry(p.key.canonical()).or_default().push(p);
    }
    let mut e = Expected::default();
    for flow in flows.values() {
        let client = flow[0].key;
        if flow[0].tcp.is_some() {
            let mut streams = [Vec::new(), Vec::new()];
            for p in flow {
                streams[usize::from(p.key != client)].extend_from_slice(&p.payload);
            }
            let c = app::check_tcp_streams(client.dst_port, &streams[0], &streams[1]);
            e.http_requests += c.http_requests;
            e.http_responses += c.http_responses;
            e.http_bodies.extend(c.http_bodies);
            e.client_hellos += c.client_hellos;
            e.server_hellos += c.server_hellos;
        } else {
            for pair in flow.chunks(2) {
                let answer = pair.get(1).map(|p| p.payload.as_slice());
                let c = app::check_udp_exchange(&client, &pair[0].payload, answer);
                e.dns_queries += c.dns_queries;
                e.dns_answers += c.dns_answers;
            }
        }
    }
    e.http_bodies.sort_unstable();
    e
}

/// Runs tshark over `path`: the frames it finds malformed or with an error, and its counts.
fn tshark(path: &Path) -> (Vec<String>, Expected) {
    let out = Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(path)
        .args([
            "-Y",
            "_ws.malformed || _ws.expert.severity >= error || dns || http || tls",
        ])
        .args(["-T", "fields", "-E", "separator=\t", "-E", "occurrence=a"])
        .args([
            "-e",
            "frame.number",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ])
        .args([
            "-e",
            "dns.flags.response",
            "-e",
            "http.request",
            "-e",
            "http.response",
        ])
        .args(["-e", "http.content_length", "-e", "tls.handshake.type"])
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let mut bad = Vec::new();
    let mut e = Expected::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 8, "{line:?}");
        // Severity: comment 0x00100000, chat 0x00200000, note 0x00400000, warn 0x00600000,
        // error 0x00800000.
        let error = f[2]
            .split(',')
            .filter_map(|s| s.parse::<u64>().ok())
            .any(|s| s >= 0x0080_0000);
        if !f[1].is_empty() || error {
            bad.push(line.to_string());
        }
        match f[3] {
            "" => {}
            "0" | "False" => e.dns_queries += 1,
            _ => e.dns_answers += 1,
        }
        e.http_requests += usize::from(!f[4].is_empty());
        e.http_responses += usize::from(!f[5].is_empty());
        e.http_bodies
            .extend(f[6].split(',').filter_map(|s| s.parse::<usize>().ok()));
        for t in f[7].split(',') {
            e.client_hellos += usize::from(t == "1");
            e.server_hellos += usize::from(t == "2");
        }
    }
    e.http_bodies.sort_unstable();
    (bad, e)
}

#[test]
fn tshark_dissects_application_data_without_errors() {
    if !tshark_or_skip("tshark_dissects_application_data_without_errors") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for (profile, flows, packets) in [
        (Profile::Mixed, 2_000, 94_000),
        (Profile::Scan, 1_000, 47_000),
        (Profile::Short, 200, 20_000),
        (Profile::Long, 4, 40_000),
    ] {
        let cfg = SynthConfig {
            flows,
            packets,
            seed: 17,
            ipv6_share: 0.2,
            tcp_share: if matches!(profile, Profile::Mixed | Profile::Scan) {
                0.8
            } else {
                1.0
            },
            ..SynthConfig::new(profile)
        };
        let trace = generate(&cfg);
        let path = dir.path().join(format!("{profile}.pcap"));
        write_pcap(&path, &trace);
        let want = expected(&trace);
        let (bad, got) = tshark(&path);
        println!(
            "{profile}: {} DNS queries, {} answers, {} HTTP requests, {} responses, {} \
             ClientHellos; tshark: {} malformed or in error",
            got.dns_queries,
            got.dns_answers,
            got.http_requests,
            got.http_responses,
            got.client_hellos,
            bad.len()
        );
        assert!(
            bad.is_empty(),
            "{profile}: {} frames: {:?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        );
        assert!(
            want.http_responses > 0 && want.client_hellos > 0,
            "{profile}: {want:?}"
        );
        if matches!(profile, Profile::Mixed | Profile::Scan) {
            assert!(want.dns_answers > 0, "{want:?}");
        }
        // Equal counts, and every response's Content-Length as our parse of the stream found.
        assert_eq!(got, want, "{profile}");
    }
}
