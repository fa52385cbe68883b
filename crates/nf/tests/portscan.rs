//! The portscan detector (TRW) on hand-built packets under a virtual clock: detection after
//! the number of failures the paper's arithmetic predicts, benign hosts cleared, RST, ICMP
//! unreachable and timeouts as failures, first contacts only, blocking, the watched direction,
//! configuration errors that name the key, and hostile packets.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::portscan::{self, Config, Factory};
use flowstate_nf::{BuildError, Packet, Verdict};
use flowstate_wire::dissect;
use std::net::{IpAddr, Ipv4Addr};

const SCANNER: &str = "192.0.2.66";
const INSIDE: &str = "10.0.0.7";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A SYN from `src` to `dst:port` and the frame that would answer it with `flags`.
fn syn(src: &str, sport: u16, dst: &str, port: u16) -> Vec<u8> {
    tcp(&format!("{src}:{sport}"), &format!("{dst}:{port}"), SYN)
}

fn answer(src: &str, sport: u16, dst: &str, port: u16, flags: u8) -> Vec<u8> {
    tcp(&format!("{dst}:{port}"), &format!("{src}:{sport}"), flags)
}

/// An outside host's attempt on an inside host answered with `flags` (0: unanswered).
fn attempt(rig: &mut Rig<portscan::Portscan>, src: &str, dst: &str, port: u16, flags: u8) {
    assert!(rig.passes(&syn(src, 40000, dst, port), IN));
    if flags != 0 {
        assert!(rig.passes(&answer(src, 40000, dst, port, flags), OUT));
    }
}

#[test]
fn four_rsts_flag_a_scanner_as_the_paper_predicts() {
    let f = Factory::new(&Config::default()).unwrap();
    assert_eq!(f.trw().failures_to_detect(), 4);
    let mut rig = portscan("");
    for port in 1..=3 {
        attempt(&mut rig, SCANNER, INSIDE, port, RST | ACK);
        assert!(!rig.nf.is_scanner(&ip(SCANNER)), "after {port} failures");
    }
    attempt(&mut rig, SCANNER, INSIDE, 4, RST | ACK);
    assert!(rig.nf.is_scanner(&ip(SCANNER)));
    assert_eq!(rig.report("alerts"), 1);
    assert_eq!(rig.report("alerts_scanner"), 1);
    assert_eq!(rig.report("alerts_scanner_inbound"), 1);
    assert_eq!(rig.report("alerts_scanner_outbound"), 0);
    assert_eq!(rig.report("attempts_failed_rst"), 4);
    let s = rig.nf.source(&ip(SCANNER)).unwrap();
    assert_eq!((s.attempts, s.failures), (4, 4));
    // Later attempts are not observed any more (and not recorded).
    let contacts = rig.nf.contacts();
    attempt(&mut rig, SCANNER, INSIDE, 5, RST | ACK);
    assert_eq!(rig.nf.contacts(), contacts);
    assert_eq!(rig.report("alerts"), 1);
    assert_eq!(rig.report("attempts_failed_rst"), 4);
}

#[test]
fn a_success_delays_detection_by_one_failure() {
    let mut rig = portscan("");
    attempt(&mut rig, SCANNER, INSIDE, 80, SYN | ACK);
    for port in 1..=4 {
        attempt(&mut rig, SCANNER, INSIDE, port, RST | ACK);
        assert!(!rig.nf.is_scanner(&ip(SCANNER)));
    }
    attempt(&mut rig, SCANNER, INSIDE, 5, RST | ACK);
    assert!(rig.nf.is_scanner(&ip(SCANNER)));
}

#[test]
fn a_mostly_successful_host_is_not_flagged_and_its_walk_ends_benign() {
    let mut rig = portscan("");
    let client = "10.1.2.3";
    // 200 first contacts, every fifth one failing (a benign host's 80 % success, θ0).
    for i in 0..200u16 {
        let dst = format!("198.51.100.{}", 1 + i % 200);
        let port = 80 + i / 200;
        let ok = i % 5 != 4;
        assert!(rig.passes(&syn(client, 50000 + i, &dst, port), OUT));
        let flags = if ok { SYN | ACK } else { RST | ACK };
        assert!(rig.passes(&answer(client, 50000 + i, &dst, port, flags), IN));
        assert!(!rig.nf.is_scanner(&ip(client)), "flagged after {i}");
    }
    assert_eq!(rig.report("alerts"), 0);
    assert!(rig.report("sources_benign") >= 1);
    assert_eq!(rig.report("attempts_succeeded"), 160);
    assert_eq!(rig.report("attempts_failed_rst"), 40);
    // The walk ends at η0 and the source's state goes (TRW: stop tracking).
    let mut rig = portscan("");
    for i in 0..4u16 {
        let dst = format!("198.51.100.{}", 1 + i);
        assert!(rig.passes(&syn(client, 50000, &dst, 443), OUT));
        assert!(rig.nf.source(&ip(client)).is_none() || i > 0);
        assert!(rig.passes(&answer(client, 50000, &dst, 443, SYN | ACK), IN));
    }
    assert!(rig.nf.source(&ip(client)).is_none());
    assert_eq!(rig.report("sources_benign"), 1);
}

#[test]
fn icmp_unreachable_counts_as_a_failure() {
    let mut rig = portscan("");
    let scanner = "10.9.9.9";
    let router = Ipv4Addr::new(198, 51, 100, 254);
    for (i, port) in (1000..1004).enumerate() {
        let s = syn(scanner, 40000, "198.51.100.10", port);
        assert!(rig.passes(&s, OUT));
        // Port unreachable (type 3, code 3) from a router, back to the scanner.
        let e = icmp4_error(router, Ipv4Addr::new(10, 9, 9, 9), 3, 3, &s);
        assert!(rig.passes(&e, IN));
        assert_eq!(rig.report("attempts_failed_icmp"), i as i64 + 1);
    }
    assert!(rig.nf.is_scanner(&ip(scanner)));
}

/// An ICMPv6 destination unreachable (type 1, `code`) from `from` to `to` quoting the IPv6
/// packet of the frame `quoted` (RFC 4443 §3.1).
fn icmp6_unreachable(from: &str, to: &str, code: u8, quoted: &[u8]) -> Vec<u8> {
    let mut msg = vec![1, code, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&quoted[14..]);
    flowstate_testkit::icmp6(from.parse().unwrap(), to.parse().unwrap(), 64, &msg)
}

#[test]
fn icmpv6_unreachable_counts_as_a_failure() {
    let mut rig = portscan("");
    for (i, port) in (1000..1004u16).enumerate() {
        let s = tcp("[fd00::9]:40000", &format!("[2001:db8::10]:{port}"), SYN);
        assert!(rig.passes(&s, OUT));
        // Port unreachable (code 4) from a router.
        let e = icmp6_unreachable("2001:db8::fe", "fd00::9", 4, &s);
        assert!(rig.passes(&e, IN));
        assert_eq!(rig.report("attempts_failed_icmp"), i as i64 + 1);
    }
    assert!(rig.nf.is_scanner(&ip("fd00::9")));
}

#[test]
fn icmp_not_about_a_pending_attempt_or_not_to_its_source_is_ignored() {
    let mut rig = portscan("");
    let s = syn("10.9.9.9", 40000, "198.51.100.10", 22);
    assert!(rig.passes(&s, OUT));
    // To someone else than the attempt's source.
    let e = icmp4_error(
        Ipv4Addr::new(198, 51, 100, 254),
        Ipv4Addr::new(10, 1, 1, 1),
        3,
        1,
        &s,
    );
    assert!(rig.passes(&e, IN));
    // Time exceeded is not unreachable.
    let e = icmp4_error(
        Ipv4Addr::new(198, 51, 100, 254),
        Ipv4Addr::new(10, 9, 9, 9),
        11,
        0,
        &s,
    );
    assert!(rig.passes(&e, IN));
    assert_eq!(rig.report("attempts_failed_icmp"), 0);
    assert_eq!(rig.nf.pending_attempts(), 1);
}

#[test]
fn unanswered_attempts_fail_at_the_timeout() {
    let mut rig = portscan("attempt_timeout = \"3s\"");
    for port in 1..=4 {
        assert!(rig.passes(&syn(SCANNER, 40000, INSIDE, port), IN));
    }
    assert_eq!(rig.nf.pending_attempts(), 4);
    rig.advance_ns(3 * SEC - 1);
    assert!(!rig.nf.is_scanner(&ip(SCANNER)));
    assert_eq!(rig.report("attempts_failed_timeout"), 0);
    rig.advance_ns(1);
    assert_eq!(rig.report("attempts_failed_timeout"), 4);
    assert!(rig.nf.is_scanner(&ip(SCANNER)));
    assert_eq!(rig.nf.pending_attempts(), 0);
    // An attempt answered in time does not time out.
    let mut rig = portscan("");
    attempt(&mut rig, "192.0.2.1", INSIDE, 80, SYN | ACK);
    rig.advance(10);
    assert_eq!(rig.report("attempts_failed_timeout"), 0);
    assert_eq!(rig.report("attempts_succeeded"), 1);
}

#[test]
fn only_first_contacts_are_observations() {
    let mut rig = portscan("");
    // The same (host, port) again and again, from new source ports: one observation.
    for i in 0..20u16 {
        assert!(rig.passes(&syn(SCANNER, 40000 + i, INSIDE, 22), IN));
        assert!(rig.passes(&answer(SCANNER, 40000 + i, INSIDE, 22, RST | ACK), OUT));
    }
    assert_eq!(rig.report("attempts_failed_rst"), 1);
    assert!(!rig.nf.is_scanner(&ip(SCANNER)));
    // A retransmitted SYN is not a second attempt.
    assert!(rig.passes(&syn(SCANNER, 41000, INSIDE, 23), IN));
    assert!(rig.passes(&syn(SCANNER, 41000, INSIDE, 23), IN));
    assert_eq!(rig.nf.pending_attempts(), 1);
    // An answer to nothing is not an observation.
    assert!(rig.passes(&answer("192.0.2.9", 1, INSIDE, 2, RST | ACK), OUT));
    assert!(rig.passes(&answer("192.0.2.9", 1, INSIDE, 2, SYN | ACK), OUT));
    assert_eq!(rig.report("attempts_failed_rst"), 1);
    assert_eq!(rig.report("attempts_succeeded"), 0);
}

#[test]
fn a_blocked_scanner_is_dropped_until_the_block_ends() {
    let mut rig = portscan("block = true\nblock_time = \"60s\"");
    for port in 1..=4 {
        attempt(&mut rig, SCANNER, INSIDE, port, RST | ACK);
    }
    assert!(rig.nf.is_scanner(&ip(SCANNER)));
    let (v, _) = rig.pass(&syn(SCANNER, 40000, INSIDE, 5), IN);
    assert_eq!(v, Verdict::Drop("portscan: blocked scanner"));
    assert_eq!(rig.report("dropped_blocked"), 1);
    // Others pass, and answers to the scanner too.
    assert!(rig.passes(&syn("192.0.2.1", 40000, INSIDE, 80), IN));
    assert!(rig.passes(&answer(SCANNER, 40000, INSIDE, 80, SYN | ACK), OUT));
    rig.advance(59);
    assert!(!rig.passes(&syn(SCANNER, 40000, INSIDE, 6), IN));
    rig.advance(1);
    assert!(rig.passes(&syn(SCANNER, 40000, INSIDE, 6), IN));
    // Without `block`, a scanner is only reported.
    let mut rig = portscan("");
    for port in 1..=4 {
        attempt(&mut rig, SCANNER, INSIDE, port, RST | ACK);
    }
    assert!(rig.nf.is_scanner(&ip(SCANNER)));
    assert!(rig.passes(&syn(SCANNER, 40000, INSIDE, 5), IN));
}

#[test]
fn the_watched_direction_is_configurable() {
    let mut rig = portscan("watch = \"outbound\"");
    for port in 1..=10 {
        attempt(&mut rig, SCANNER, INSIDE, port, RST | ACK);
    }
    assert!(!rig.nf.is_scanner(&ip(SCANNER)));
    assert_eq!(rig.report("attempts_failed_rst"), 0);
    let mut rig = portscan("watch = \"inbound\"");
    for port in 1..=10 {
        assert!(rig.passes(&syn(INSIDE, 40000, "192.0.2.5", port), OUT));
        assert!(rig.passes(&answer(INSIDE, 40000, "192.0.2.5", port, RST | ACK), IN));
    }
    assert!(!rig.nf.is_scanner(&ip(INSIDE)));
    for port in 1..=4 {
        attempt(&mut rig, SCANNER, INSIDE, port, RST | ACK);
    }
    assert!(rig.nf.is_scanner(&ip(SCANNER)));
}

#[test]
fn ipv6_sources_are_watched_too() {
    let mut rig = portscan("");
    for port in 1..=4u16 {
        let s = tcp("[2001:db8::66]:40000", &format!("[fd00::7]:{port}"), SYN);
        assert!(rig.passes(&s, IN));
        let a = tcp(
            &format!("[fd00::7]:{port}"),
            "[2001:db8::66]:40000",
            RST | ACK,
        );
        assert!(rig.passes(&a, OUT));
    }
    assert!(rig.nf.is_scanner(&ip("2001:db8::66")));
}

#[test]
fn alerts_are_eve_json() {
    let mut rig = portscan("block = true");
    let mut alert = None;
    rig.now = 1_709_210_096_789_012_345;
    for port in 1..=4 {
        let mut s = syn(SCANNER, 40000, INSIDE, port);
        let mut a = answer(SCANNER, 40000, INSIDE, port, RST | ACK);
        for (f, dir) in [(&mut s, IN), (&mut a, OUT)] {
            let d = dissect(f).unwrap();
            let pkt = Packet {
                data: f,
                dissection: d,
                direction: dir,
            };
            let (v, al) = rig.nf.process_alert(&pkt, rig.now);
            assert_eq!(v, Verdict::Forward);
            alert = alert.or(al);
        }
    }
    let alert = alert.expect("an alert");
    assert_eq!(alert.src, ip(SCANNER));
    assert_eq!((alert.dst, alert.dst_port), (ip(INSIDE), 4));
    assert_eq!((alert.attempts, alert.failures), (4, 4));
    assert!((alert.likelihood - 256.0).abs() < 1e-9);
    let line = portscan::eve_json(&alert);
    let v: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
    assert_eq!(v["event_type"], "alert");
    assert_eq!(v["timestamp"], "2024-02-29T12:34:56.789012+0000");
    assert_eq!(v["src_ip"], SCANNER);
    assert_eq!(v["dest_ip"], INSIDE);
    assert_eq!(v["dest_port"], 4);
    assert_eq!(v["proto"], "TCP");
    assert_eq!(v["alert"]["signature"], "portscan: TRW");
    assert_eq!(v["alert"]["signature_id"], portscan::SIGNATURE_ID);
    assert_eq!(v["alert"]["action"], "blocked");
    assert_eq!(v["portscan"]["failures"], 4);
    assert_eq!(v["portscan"]["direction"], "inbound");
}

fn config_error(toml_text: &str) -> (String, String) {
    let r = Config::from_table(&table(toml_text)).and_then(|c| Factory::new(&c));
    match r {
        Err(BuildError::Config { nf, key, reason }) => {
            assert_eq!(nf, "portscan");
            (key, reason)
        }
        Err(e) => panic!("{toml_text}: {e}"),
        Ok(_) => panic!("{toml_text}: accepted"),
    }
}

#[test]
fn configuration_errors_name_the_key() {
    for (text, key) in [
        ("theta0 = 1.5", "theta0"),
        ("theta0 = \"high\"", "theta0"),
        ("theta1 = 0.0", "theta1"),
        ("theta1 = 0.9", "theta1"),
        ("detection_probability = 1.0", "detection_probability"),
        (
            "false_positive_probability = -0.1",
            "false_positive_probability",
        ),
        (
            "detection_probability = 0.2\nfalse_positive_probability = 0.3",
            "false_positive_probability",
        ),
        ("attempt_timeout = \"0s\"", "attempt_timeout"),
        ("attempt_timeout = 3", "attempt_timeout"),
        ("attempt_timeout = -3.0", "attempt_timeout"),
        ("source_timeout = inf", "source_timeout"),
        ("watch = \"sideways\"", "watch"),
        ("watch = 3", "watch"),
        ("block = \"yes\"", "block"),
        ("block_time = \"0ms\"", "block_time"),
        ("max_contacts = 0", "max_contacts"),
        ("thresh = 3", "thresh"),
    ] {
        let (k, reason) = config_error(text);
        assert_eq!(k, key, "{text}: {reason}");
    }
    let (_, reason) = config_error("thresh = 3");
    assert!(
        reason.contains("thresh") && reason.contains("theta0"),
        "{reason}"
    );
    // The defaults and the registry.
    Factory::new(&Config::from_table(&table("")).unwrap()).unwrap();
    assert!(flowstate_nf::registry::names().any(|n| n == "portscan"));
    let f = flowstate_nf::registry::factory("portscan", &table("block = true")).unwrap();
    assert!(!f.fast_path());
}

#[test]
fn hostile_packets_never_panic() {
    let mut rig = portscan("block = true\nmax_contacts = 50");
    let seeds = [
        syn(SCANNER, 40000, INSIDE, 22),
        answer(SCANNER, 40000, INSIDE, 22, RST | ACK),
        answer(SCANNER, 40000, INSIDE, 22, SYN | ACK),
        icmp4_error(
            Ipv4Addr::new(10, 0, 0, 254),
            Ipv4Addr::new(192, 0, 2, 66),
            3,
            3,
            &syn(SCANNER, 40000, INSIDE, 22),
        ),
        tcp("[2001:db8::66]:1", "[fd00::7]:2", SYN),
    ]
    .into_iter()
    .collect::<Vec<_>>();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut fed = 0;
    for round in 0..20_000 {
        let mut f = seeds[round % seeds.len()].clone();
        // Flip a few bytes past the Ethernet header, and sometimes cut the frame.
        for _ in 0..1 + next() % 4 {
            let i = 14 + (next() as usize) % (f.len() - 14);
            f[i] = next() as u8;
        }
        if next() % 3 == 0 {
            let cut = 14 + (next() as usize) % (f.len() - 14);
            f.truncate(cut);
        }
        let Ok(d) = dissect(&f) else { continue };
        let dir = if next() % 2 == 0 { IN } else { OUT };
        let pkt = Packet {
            data: &mut f,
            dissection: d,
            direction: dir,
        };
        let _ = rig.nf.process_alert(&pkt, rig.now);
        fed += 1;
        if round % 1000 == 0 {
            rig.advance(5);
        }
    }
    assert!(fed > 1000, "only {fed} frames dissected");
    assert!(rig.nf.contacts() <= 50);
}

/// `max_flows` bounds the pending attempts: at the cap a new first contact ends the oldest
/// pending attempt (early drop: all are unanswered), which is then forgotten, not failed;
/// without early drop the new one is not observed (nor recorded). Answered attempts leave
/// the table at once.
#[test]
fn pending_attempts_hold_at_most_max_flows() {
    const CAP: i64 = 3;
    const EXTRA: u16 = 4;
    let src = "198.51.100.9";
    for early_drop in [true, false] {
        let mut rig = portscan(&format!("max_flows = {CAP}\nearly_drop = {early_drop}"));
        assert_eq!(rig.report("max_flows"), CAP);
        attempt(&mut rig, src, INSIDE, 1, SYN | ACK); // answered: not pending
        let total = CAP as u16 + EXTRA;
        for port in 0..total {
            attempt(&mut rig, src, INSIDE, 100 + port, 0);
            assert!(rig.nf.pending_attempts() <= CAP as usize);
        }
        assert_eq!(rig.nf.pending_attempts(), CAP as usize);
        let excess = i64::from(EXTRA);
        let (dropped, full) = if early_drop { (excess, 0) } else { (0, excess) };
        assert_eq!(rig.report("flows_early_dropped"), dropped, "{early_drop}");
        assert_eq!(rig.report("flows_table_full"), full, "{early_drop}");
        assert_eq!(rig.nf.contacts() as i64, 1 + CAP + dropped);
        // Early drop kept the newest attempts, else the oldest: their answers are observed;
        // the others' are not, and nothing counted as failed.
        let (kept, lost) = if early_drop {
            (100 + total - 1, 100)
        } else {
            (100, 100 + total - 1)
        };
        assert!(rig.passes(&answer(src, 40000, INSIDE, kept, SYN | ACK), OUT));
        assert!(rig.passes(&answer(src, 40000, INSIDE, lost, SYN | ACK), OUT));
        assert_eq!(rig.report("attempts_succeeded"), 2, "{early_drop}");
        assert_eq!(rig.report("attempts_failed_timeout"), 0);
    }
}

#[test]
fn cap_keys_are_checked() {
    for (toml_text, want) in [
        ("max_flows = 0", "max_flows"),
        ("max_flows = 1.5", "max_flows"),
        ("early_drop = \"sure\"", "early_drop"),
    ] {
        match Config::from_table(&table(toml_text)) {
            Err(BuildError::Config { key, .. }) => assert_eq!(key, want, "{toml_text}"),
            Err(e) => panic!("{toml_text}: {e}"),
            Ok(_) => panic!("{toml_text}: accepted"),
        }
    }
}
