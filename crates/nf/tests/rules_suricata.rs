//! The rules against **Suricata** itself (installed by scripts/setup-live from
//! bookworm-backports): the rules it refuses are the ones we refuse (`suricata -T`), and on
//! packets it reads from a capture (`suricata -r`) its alerts are the rules whose contents we
//! match. Skipped with a message when `suricata` is missing.

use flowstate_io::pcap::PcapWriter;
use flowstate_io::PacketMeta;
use flowstate_nf::rules::{parse, Options};
use flowstate_testkit::{run_suricata, suricata_or_skip, udp4, SURICATA_YAML};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;

/// One rule a line. Every keyword here is in our subset; Suricata's verdict is the oracle.
const CORPUS: &[&str] = &[
    r#"alert tcp $EXTERNAL_NET any -> $HOME_NET 80 (msg:"ok"; flow:to_server,established; content:"GET"; depth:3; content:"|2e 2e|/"; distance:0; within:64; nocase; sid:1; rev:1;)"#,
    r#"alert tcp any any -> any any (msg:"no sid";)"#,
    r#"alert tcp any any -> any any (content:"a"; distance:1; sid:3;)"#,
    r#"alert tcp any any -> any any (content:"abc"; depth:2; sid:4;)"#,
    r#"alert tcp any 10:5 -> any any (sid:5;)"#,
    r#"alert tcp 10.1.2.3/8 any -> any any (sid:6;)"#,
    r#"alert tcp any any -> any any (flow:to_server,to_client; sid:7;)"#,
    r#"alert ip [10.0.0.0/8,![10.1.0.0/16,10.2.3.4]] [1024:,!5000:5010] <> 192.168.1.77/24 :1023 (sid:8;)"#,
    r#"alert tcp any any -> any any (nocase; sid:9;)"#,
    r#"alert tcp any any -> any any (content:"a"; within:5; sid:10;)"#,
    r#"alert tcp any any -> any any (content:"abc"; content:"d"; within:0; sid:11;)"#,
    r#"alert tcp any any -> any any (content:"abc"; offset:5; depth:3; sid:12;)"#,
    r#"alert tcp any any -> any any (content:!"abc"; sid:13;)"#,
    r#"alert tcp any any -> any any (content:"a|3b|b"; sid:14;)"#,
    r#"alert tcp any any -> any any (content:"a\;b"; sid:15;)"#,
    r#"alert tcp any any -> any any (content:"a;b"; sid:16;)"#,
    r#"alert tcp any any -> any any (content:""; sid:17;)"#,
    r#"alert tcp any any -> any any (msg:"x"; sid:18; rev:2; classtype:bad-unknown; priority:1;)"#,
    r#"alert tcp [1.2.3.4, 5.6.7.8] any -> any any (sid:19;)"#,
    r#"alert tcp any any <> any any (sid:20;)"#,
    r#"alert tcp !any any -> any any (sid:21;)"#,
    r#"alert tcp any any -> any any (content:"|41 4|"; sid:22;)"#,
    r#"alert tcp any any -> any any (content:"ab"; distance:-1; content:"c"; sid:23;)"#,
    r#"alert tcp any [80,443] -> any any (sid:24;)"#,
    r#"alert tcp any any -> any 65536 (sid:25;)"#,
    r#"alert tcp any any -> any any (flow:established,to_client; sid:26;)"#,
    r#"alert tcp $HOME_NET any -> $EXTERNAL_NET $HTTP_PORTS (sid:27;)"#,
    r#"alert tcp any any -> any any (msg:"a\"b"; sid:28;)"#,
    r#"alert tcp any any -> any any (sid:29)"#,
    r#"drop udp any any -> any 53 (msg:"dns"; content:"|01 00 00 01|"; offset:2; depth:4; sid:30;)"#,
    r#"alert tcp any any -> any any (sid:31; sid:32;)"#,
    r#"alert tcp any any => any any (sid:33;)"#,
    r#"alert tcp any any -> any any (content:"x"; offset:1; offset:2; sid:34;)"#,
    r#"alert tcp 2001:db8::/32 any -> any 443 (sid:35;)"#,
    r#"alert tcp any any -> any any (content:"a"; nocase; nocase; sid:36;)"#,
    r#"alert tcp any any -> any any (flow:to_server; flow:established; sid:37;)"#,
    r#"alert tcp any any -> any any (sid:38; rev:1; rev:2;)"#,
    r#"alert tcp any any -> any any (msg:"a"; msg:"b"; sid:39;)"#,
    r#"alert tcp any any -> any any (content:"abc"; depth:3; depth:4; sid:40;)"#,
    r#"alert tcp any any -> any any (content:"a"; content:"b"; distance:1; distance:2; sid:41;)"#,
    r#"alert tcp any any -> any any (content:"a"; content:"b"; within:3; within:4; sid:42;)"#,
    r#"alert tcp any any -> any any (content:"a"; fast_pattern; fast_pattern; sid:43;)"#,
    r#"alert tcp any any -> any any (classtype:bad-unknown; classtype:bad-unknown; sid:44;)"#,
    r#"alert tcp any any -> any any (priority:1; priority:2; sid:45;)"#,
    r#"alert tcp any any -> any any (content:"a"; fast_pattern; content:"b"; fast_pattern; sid:46;)"#,
    r#"alert tcp any any -> any any (content:"abc"; offset:1; distance:1; sid:47;)"#,
    r#"alert tcp any any -> any any (content:"abc"; depth:3; within:4; sid:48;)"#,
    r#"alert tcp any any -> any any (content:"abc"; distance:1; depth:4; sid:49;)"#,
];

#[test]
fn the_rules_suricata_refuses_are_the_ones_we_refuse() {
    if !suricata_or_skip("the_rules_suricata_refuses_are_the_ones_we_refuse") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("corpus.rules");
    std::fs::write(&file, CORPUS.join("\n") + "\n").unwrap();
    let out = Command::new("suricata")
        .args(["-T", "-c", SURICATA_YAML, "-S"])
        .arg(&file)
        .arg("-l")
        .arg(dir.path())
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // "error parsing signature \"...\" from file F at line N"
    let theirs: BTreeSet<usize> = log
        .lines()
        .filter(|l| l.contains("error parsing signature"))
        .filter_map(|l| l.rsplit("at line ").next()?.trim().parse().ok())
        .collect();
    assert!(
        !theirs.is_empty() && theirs.len() < CORPUS.len(),
        "suricata's log is not what this test reads:\n{log}"
    );
    let ours: BTreeSet<usize> = CORPUS
        .iter()
        .enumerate()
        .filter(|(_, r)| parse("corpus.rules", r, &Options::default()).is_err())
        .map(|(i, _)| i + 1)
        .collect();
    let show =
        |lines: &BTreeSet<usize>| -> Vec<&str> { lines.iter().map(|&l| CORPUS[l - 1]).collect() };
    assert_eq!(
        ours,
        theirs,
        "\nwe refuse but suricata takes: {:#?}\nsuricata refuses but we take: {:#?}",
        show(&ours.difference(&theirs).copied().collect()),
        show(&theirs.difference(&ours).copied().collect())
    );
}

/// A UDP packet from the client to port `port` of the server carrying `payload`.
fn udp(port: u16, payload: &[u8]) -> Vec<u8> {
    udp4(
        (Ipv4Addr::new(10, 0, 0, 2), 40000),
        (Ipv4Addr::new(198, 51, 100, 2), port),
        payload,
    )
}

/// Payload tests: rule options, and a payload they are tried on.
fn content_cases() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(String, Vec<u8>)> = [
        ("content:\"GET\";", &b"xx GET /"[..]),
        ("content:\"GET\";", b"xx get /"),
        ("content:\"GET\"; nocase;", b"xx get /"),
        ("content:\"GET\"; depth:3;", b"GET /"),
        ("content:\"GET\"; depth:3;", b" GET /"),
        ("content:\"GET\"; offset:1; depth:3;", b" GET /"),
        ("content:\"GET\"; offset:2;", b" GET /"),
        (
            "content:\"a\"; content:\"b\"; distance:0; within:3;",
            b"a..b",
        ),
        (
            "content:\"a\"; content:\"b\"; distance:0; within:3;",
            b"a...b",
        ),
        (
            "content:\"a\"; content:\"b\"; distance:2; within:2;",
            b"a..b",
        ),
        ("content:\"a\"; content:\"b\"; distance:2;", b"ab"),
        (
            "content:\"ab\"; content:\"a\"; distance:-2; within:1;",
            b"ab",
        ),
        ("content:\"a\"; content:\"b\"; within:1;", b"a.ab"),
        ("content:\"b\"; within:2;", b"ab"),
        ("content:\"b\"; within:2;", b"aab"),
        (
            "content:\"a\"; content:!\"x\"; distance:0; within:2;",
            b"a.bx",
        ),
        (
            "content:\"a\"; content:!\"x\"; distance:0; within:2;",
            b"a.x",
        ),
        ("content:\"ok\"; content:!\"evil\";", b"ok good"),
        ("content:\"ok\"; content:!\"evil\";", b"ok so evil"),
        (
            "content:\"|00 01|\"; content:\"|ff|\"; distance:1;",
            b"\x00\x01?\xff",
        ),
    ]
    .iter()
    .map(|(o, p)| (o.to_string(), p.to_vec()))
    .collect();
    // Random rules of up to three contents over a small alphabet, each on a random payload.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..300 {
        let mut opts = String::new();
        let contents = 1 + next(3);
        for k in 0..contents {
            let len = 1 + next(2) as usize;
            let pat: String = (0..len)
                .map(|_| ['a', 'b', 'A'][next(3) as usize])
                .collect();
            let negated = k > 0 && next(4) == 0;
            opts.push_str(&format!(
                "content:{}\"{pat}\"; ",
                if negated { "!" } else { "" }
            ));
            if next(3) == 0 {
                opts.push_str("nocase; ");
            }
            match next(4) {
                0 => opts.push_str(&format!(
                    "offset:{}; depth:{}; ",
                    next(3),
                    len as u64 + next(4)
                )),
                1 if k > 0 => opts.push_str(&format!("distance:{}; ", next(4) as i64 - 1)),
                2 if k > 0 => opts.push_str(&format!(
                    "distance:{}; within:{}; ",
                    next(3),
                    len as u64 + next(3)
                )),
                _ => {}
            }
        }
        let plen = next(10) as usize;
        let payload: Vec<u8> = (0..plen).map(|_| b"abA."[next(4) as usize]).collect();
        cases.push((opts, payload));
    }
    cases
}

#[test]
fn on_packets_suricata_alerts_on_the_rules_whose_contents_we_match() {
    if !suricata_or_skip("on_packets_suricata_alerts_on_the_rules_whose_contents_we_match") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases = content_cases();
    // Rule i (sid i + 1) looks only at port 10000 + i, where its one packet goes.
    let rules: Vec<String> = cases
        .iter()
        .enumerate()
        .map(|(i, (opts, _))| {
            format!(
                "alert udp any any -> any {} ({opts}sid:{};)",
                10000 + i,
                i + 1
            )
        })
        .collect();
    let rules_file = dir.path().join("payload.rules");
    std::fs::write(&rules_file, rules.join("\n") + "\n").unwrap();
    let pcap = dir.path().join("payload.pcap");
    let mut w = PcapWriter::create(&pcap).unwrap();
    for (i, (_, payload)) in cases.iter().enumerate() {
        let f = udp(10000 + i as u16, payload);
        let meta = PacketMeta {
            timestamp_ns: 1_700_000_000_000_000_000 + i as u64 * 1_000_000,
            wire_len: f.len() as u32,
            port: 0,
            user: 0,
        };
        w.write_packet(&f, &meta).unwrap();
    }
    w.finish().unwrap();
    run_suricata(&pcap, &rules_file, dir.path(), &[]);
    let eve = std::fs::read_to_string(dir.path().join("eve.json")).unwrap();
    let theirs: BTreeSet<usize> = eve
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event_type"] == "alert")
        .map(|e| e["alert"]["signature_id"].as_u64().unwrap() as usize)
        .collect();
    let set = parse(
        "payload.rules",
        &(rules.join("\n") + "\n"),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(set.rules.len(), cases.len(), "every generated rule is ours");
    let ours: BTreeSet<usize> = set
        .rules
        .iter()
        .zip(&cases)
        .filter(|(r, (_, payload))| r.payload_matches(payload))
        .map(|(r, _)| r.sid as usize)
        .collect();
    assert!(!ours.is_empty() && ours.len() < cases.len(), "{ours:?}");
    eprintln!(
        "{} rules on their packets: {} match here, {} alert in suricata",
        cases.len(),
        ours.len(),
        theirs.len()
    );
    let show = |sids: BTreeSet<usize>| -> Vec<String> {
        sids.iter()
            .map(|&s| {
                format!(
                    "{} on {:?}",
                    rules[s - 1],
                    String::from_utf8_lossy(&cases[s - 1].1)
                )
            })
            .collect()
    };
    assert_eq!(
        ours,
        theirs,
        "\nwe match, suricata does not: {:#?}\nsuricata matches, we do not: {:#?}",
        show(ours.difference(&theirs).copied().collect()),
        show(theirs.difference(&ours).copied().collect())
    );
}
