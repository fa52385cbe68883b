//! The rule parser against **Suricata** itself (`suricata -T`, installed by
//! scripts/setup-live from bookworm-backports): on a corpus of rules within our subset, well
//! formed and not, the rules Suricata refuses are exactly the ones we refuse. Skipped with a
//! message when `suricata` is missing.

use flowstate_nf::rules::{parse, Options};
use std::collections::BTreeSet;
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
    let Ok(v) = Command::new("suricata").arg("-V").output() else {
        eprintln!("skipped: no suricata (scripts/setup-live installs it)");
        return;
    };
    assert!(v.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("corpus.rules");
    std::fs::write(&file, CORPUS.join("\n") + "\n").unwrap();
    let out = Command::new("suricata")
        .args(["-T", "-c", "/etc/suricata/suricata.yaml", "-S"])
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
