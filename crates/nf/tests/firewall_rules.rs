//! Firewall: rule matching and precedence, default policies, configuration errors.

mod common_fwlb;

use common_fwlb::*;
use flowstate_config::{parse_prefix, PrefixMatch};
use flowstate_nf::firewall::{self, Reason};
use flowstate_nf::{BuildError, Verdict};

#[test]
fn first_matching_rule_wins() {
    let deny_then_allow = r#"rules = [
        { action = "deny", proto = "tcp", dst = "198.51.100.7" },
        { action = "allow", proto = "tcp", dst = "198.51.100.0/24", direction = "inbound" },
    ]"#;
    let mut rig = firewall(deny_then_allow);
    assert_eq!(
        rig.pass(&tcp("10.0.0.5:40000", "198.51.100.7:80", SYN), OUT)
            .0,
        Verdict::Drop(Reason::DenyRule.text())
    );
    assert_eq!(
        rig.pass(&tcp("203.0.113.1:40000", "198.51.100.7:80", SYN), IN)
            .0,
        Verdict::Drop(Reason::DenyRule.text())
    );
    assert!(rig.passes(&tcp("203.0.113.1:40000", "198.51.100.8:80", SYN), IN));
    assert!(rig.passes(&tcp("10.0.0.5:40000", "198.51.100.8:80", SYN), OUT));
    assert_eq!(rig.nf.count(Reason::DenyRule), 2);
    assert_eq!(rig.nf.count(Reason::AllowRule), 1);
    assert_eq!(rig.nf.count(Reason::AllowPolicy), 1);

    let allow_then_deny = r#"rules = [
        { action = "allow", proto = "tcp", dst = "198.51.100.0/24", direction = "inbound" },
        { action = "deny", proto = "tcp", dst = "198.51.100.7" },
    ]"#;
    let mut rig = firewall(allow_then_deny);
    assert!(rig.passes(&tcp("203.0.113.1:40000", "198.51.100.7:80", SYN), IN));
    assert!(!rig.passes(&tcp("10.0.0.5:40000", "198.51.100.7:80", SYN), OUT));
}

#[test]
fn rules_match_protocol_prefixes_ports_and_direction() {
    let mut rig = firewall(
        r#"rules = [
            { action = "deny", src = "10.0.66.0/24" },
            { action = "deny", proto = "udp", dport = 53, direction = "outbound" },
            { action = "allow", proto = 17, src = "203.0.113.0/24", dport = "5000-5010" },
        ]"#,
    );
    // Source prefix, any protocol.
    assert!(!rig.passes(&tcp("10.0.66.1:1000", "198.51.100.1:80", SYN), OUT));
    assert!(!rig.passes(&echo("10.0.66.1", "198.51.100.1", 1, false), OUT));
    assert!(rig.passes(&tcp("10.0.67.1:1000", "198.51.100.1:80", SYN), OUT));
    // UDP 53 outbound only.
    assert!(!rig.passes(&udp("10.0.0.5:5353", "198.51.100.53:53"), OUT));
    assert!(rig.passes(&tcp("10.0.0.5:5353", "198.51.100.53:53", SYN), OUT));
    // Protocol by number, port range bounds.
    for (port, ok) in [(4999, false), (5000, true), (5010, true), (5011, false)] {
        let f = udp("203.0.113.4:9", &format!("10.0.0.5:{port}"));
        assert_eq!(rig.passes(&f, IN), ok, "port {port}");
    }
    assert!(!rig.passes(&udp("203.0.114.4:9", "10.0.0.5:5000"), IN));
}

#[test]
fn default_policies_are_configurable() {
    let mut rig = firewall(
        r#"default_outbound = "deny"
        rules = [{ action = "allow", proto = "tcp", dport = 443, direction = "outbound" }]"#,
    );
    assert_eq!(
        rig.pass(&tcp("10.0.0.5:40000", "198.51.100.7:80", SYN), OUT)
            .0,
        Verdict::Drop(Reason::OutboundPolicy.text())
    );
    assert!(rig.passes(&tcp("10.0.0.5:40000", "198.51.100.7:443", SYN), OUT));
    // The answer to an allowed connection still passes.
    assert!(rig.passes(&tcp("198.51.100.7:443", "10.0.0.5:40000", SYN | ACK), IN));

    let mut open = firewall(r#"default_inbound = "allow""#);
    assert!(open.passes(&tcp("203.0.113.1:1", "10.0.0.5:22", SYN), IN));
    assert_eq!(open.nf.count(Reason::AllowPolicy), 1);
    // Tracked like any connection: its answer goes out.
    assert!(open.passes(&tcp("10.0.0.5:22", "203.0.113.1:1", SYN | ACK), OUT));
}

#[test]
fn prefixes() {
    let p = parse_prefix("198.51.100.0/24").unwrap();
    assert!(p.matches(&"198.51.100.255".parse().unwrap()));
    assert!(!p.matches(&"198.51.101.0".parse().unwrap()));
    assert!(!p.matches(&"::ffff:198.51.100.1".parse().unwrap()));
    let all = parse_prefix("0.0.0.0/0").unwrap();
    assert!(all.matches(&"1.2.3.4".parse().unwrap()));
    assert!(!all.matches(&"::1".parse().unwrap()));
    let v6 = parse_prefix("2001:db8::/32").unwrap();
    assert!(v6.matches(&"2001:db8:ffff::1".parse().unwrap()));
    assert!(!v6.matches(&"2001:db9::1".parse().unwrap()));
    assert!(parse_prefix("::/0")
        .unwrap()
        .matches(&"::1".parse().unwrap()));
    let host = parse_prefix("10.1.2.3").unwrap();
    assert!(host.matches(&"10.1.2.3".parse().unwrap()));
    assert!(!host.matches(&"10.1.2.4".parse().unwrap()));
    for bad in [
        "10.0.0.1/8",
        "10.0.0.0/33",
        "2001:db8::/129",
        "nope",
        "10.0.0.0/x",
        "",
    ] {
        assert!(parse_prefix(bad).is_err(), "{bad}");
    }
}

fn config_error(text: &str) -> (String, String) {
    let r = firewall::Config::from_table(&table(text)).and_then(|c| firewall::Factory::new(&c));
    match r {
        Err(BuildError::Config { nf, key, reason }) => {
            assert_eq!(nf, "firewall");
            (key, reason)
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted: {text}"),
    }
}

#[test]
fn configuration_errors_name_the_key() {
    let cases = [
        ("colour = 1", "colour", "colour"),
        (r#"default_outbound = "maybe""#, "default_outbound", "maybe"),
        (r#"default_inbound = 1"#, "default_inbound", ""),
        ("rules = 3", "rules", "sequence"),
        (
            r#"rules = [{ action = "allow", prot = "tcp" }]"#,
            "rules[0].prot",
            "prot",
        ),
        (
            r#"rules = [{ proto = "tcp" }]"#,
            "rules[0].action",
            "action",
        ),
        (
            r#"rules = [{ action = "allow", src = "10.0.0.1/8" }]"#,
            "rules[0].src",
            "10.0.0.1/8: host bits set; did you mean 10.0.0.0/8?",
        ),
        (
            r#"rules = [{ action = "allow" }, { action = "allow", dst = "300.0.0.0/8" }]"#,
            "rules[1].dst",
            "300.0.0.0/8",
        ),
        (
            r#"rules = [{ action = "allow", src = "10.0.0.0/8", dst = "::/0" }]"#,
            "rules[0].dst",
            "famil",
        ),
        (
            r#"rules = [{ action = "allow", proto = "sctp" }]"#,
            "rules[0].proto",
            "sctp",
        ),
        (
            r#"rules = [{ action = "allow", proto = 300 }]"#,
            "rules[0].proto",
            "300",
        ),
        (
            r#"rules = [{ action = "allow", dport = "443-80" }]"#,
            "rules[0].dport",
            "empty",
        ),
        (
            r#"rules = [{ action = "allow", dport = 70000 }]"#,
            "rules[0].dport",
            "70000",
        ),
        (
            r#"rules = [{ action = "allow", proto = "icmp", dport = 80 }]"#,
            "rules[0].dport",
            "tcp",
        ),
        (
            r#"rules = [{ action = "allow", direction = "sideways" }]"#,
            "rules[0].direction",
            "sideways",
        ),
        (
            "timeouts = { established = -1 }",
            "timeouts.established",
            "write a duration with its unit, e.g. \"-1s\"",
        ),
        (
            "timeouts = { udp_replied = \"0s\" }",
            "timeouts.udp_replied",
            "above zero",
        ),
        ("timeouts = { forever = 1 }", "timeouts.forever", "forever"),
    ];
    for (text, key, needle) in cases {
        let (k, reason) = config_error(text);
        assert_eq!(k, key, "{text}: {reason}");
        assert!(
            reason.contains(needle),
            "{text}: {reason:?} lacks {needle:?}"
        );
    }
}

#[test]
fn accepted_configuration() {
    let c = firewall::Config::from_table(&table(
        r#"
        default_outbound = "allow"
        default_inbound = "deny"
        timeouts = { established = "3600s", udp_replied = "180.5s" }
        rules = [
            { action = "allow", proto = "tcp", dst = "198.51.100.0/24", dport = "80-443", direction = "inbound" },
            { action = "deny", proto = "any", src = "2001:db8::/32" },
            { action = "allow", proto = "icmpv6", direction = "any" },
        ]
        "#,
    ))
    .unwrap();
    assert_eq!(c.rules.len(), 3);
    assert_eq!(c.timeouts.established, std::time::Duration::from_secs(3600));
    assert_eq!(c.timeouts.syn_sent, std::time::Duration::from_secs(120));
    assert!(firewall::Factory::new(&c).is_ok());
    assert!(firewall::factory(&table("")).is_ok());
}
