//! Load balancer: the Maglev table (balance, determinism, minimal disruption) and Maglev VIPs;
//! configuration errors.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::lb::{self, flow_hash, MaglevTable};
use flowstate_nf::{BuildError, Direction, Verdict};
use std::collections::HashMap;

fn names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.9.{}.{}:80", i / 250, i % 250 + 1))
        .collect()
}

fn counts(t: &MaglevTable, n: usize) -> Vec<usize> {
    let mut c = vec![0; n];
    for &e in t.entries() {
        c[usize::from(e)] += 1;
    }
    c
}

#[test]
fn every_backend_gets_its_share_of_the_table() {
    for n in [1, 2, 3, 5, 7, 10, 64] {
        let t = MaglevTable::new(&names(n), MaglevTable::DEFAULT_SIZE).unwrap();
        assert_eq!(t.size(), 65537);
        let c = counts(&t, n);
        let (lo, hi) = (c.iter().min().unwrap(), c.iter().max().unwrap());
        // Backends claim entries in turns, so shares differ by at most one.
        assert!(hi - lo <= 1, "n={n}: {c:?}");
        assert_eq!(c.iter().sum::<usize>(), 65537);
    }
    // A small prime table too.
    let t = MaglevTable::new(&names(3), 7).unwrap();
    assert_eq!(t.size(), 7);
    assert!(counts(&t, 3).iter().all(|&c| c == 2 || c == 3));
}

#[test]
fn the_table_is_deterministic() {
    let a = MaglevTable::new(&names(5), 65537).unwrap();
    let b = MaglevTable::new(&names(5), 65537).unwrap();
    assert_eq!(a, b);
    // A fixed sample: a regression in the hashing would move these.
    // A fixed sample: a change to the hashing or the fill order would move these, and with
    // them every flow of every deployment.
    assert_eq!(
        &a.entries()[..16],
        &[1, 2, 1, 2, 1, 3, 0, 4, 4, 1, 0, 3, 3, 1, 2, 1]
    );
    // The order of backends in the list does not matter for who gets which entry.
    let mut rev = names(5);
    rev.reverse();
    let r = MaglevTable::new(&rev, 65537).unwrap();
    let same = a
        .entries()
        .iter()
        .zip(r.entries())
        .filter(|(x, y)| usize::from(**x) == 4 - usize::from(**y))
        .count();
    assert!(same as f64 > 0.9 * 65537.0, "{same}");
}

#[test]
fn removing_a_backend_moves_about_one_nth_of_the_entries() {
    for n in [3usize, 5, 10, 20] {
        let all = names(n);
        let before = MaglevTable::new(&all, 65537).unwrap();
        let gone = n / 2;
        let rest: Vec<String> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != gone)
            .map(|(_, s)| s.clone())
            .collect();
        let after = MaglevTable::new(&rest, 65537).unwrap();
        // Map the new indices back to names.
        let name_before = |i: u16| &all[usize::from(i)];
        let name_after = |i: u16| &rest[usize::from(i)];
        let mut moved = 0usize;
        let mut moved_not_forced = 0usize;
        for (x, y) in before.entries().iter().zip(after.entries()) {
            if name_before(*x) != name_after(*y) {
                moved += 1;
                if usize::from(*x) != gone {
                    moved_not_forced += 1;
                }
            }
        }
        let m = 65537.0;
        let share = 1.0 / n as f64;
        let frac = moved as f64 / m;
        // The removed backend's entries must move; few others do.
        assert!(frac >= share * 0.99, "n={n}: {frac}");
        // (Measured: at most 0.4% of the entries move beyond the removed backend's.)
        assert!(frac <= share + 0.01, "n={n}: moved {frac}, 1/N = {share}");
        assert!(
            (moved_not_forced as f64 / m) < 0.01,
            "n={n}: {moved_not_forced}"
        );
    }
}

#[test]
fn table_errors() {
    assert!(MaglevTable::new(&names(3), 65536).is_err());
    assert!(MaglevTable::new(&names(3), 1).is_err());
    assert!(MaglevTable::new(&names(5), 3).is_err());
    assert!(MaglevTable::new(&Vec::<String>::new(), 7).is_err());
    assert!(MaglevTable::new(&names(3), 3).is_ok());
}

const CONFIG: &str = r#"
vips = [{ vip = "203.0.113.11", port = 80, backends = ["10.2.0.1", "10.2.0.2", "10.2.0.3"], method = "maglev" }]
"#;

#[test]
fn maglev_vip_spreads_flows_evenly_and_deterministically() {
    let mut a = lb(CONFIG);
    let mut b = lb(CONFIG);
    let mut per: HashMap<std::net::IpAddr, usize> = HashMap::new();
    let flows = 3000;
    let factory = lb::Factory::new(&lb::Config::from_table(&table(CONFIG)).unwrap()).unwrap();
    for i in 0..flows {
        let c = format!("198.51.{}.{}:{}", 100 + i % 3, i % 200 + 1, 10000 + i);
        let syn = tcp(&c, "203.0.113.11:80", SYN);
        let (va, oa) = a.pass(&syn, Direction::Inbound);
        let (vb, ob) = b.pass(&syn, Direction::Inbound);
        assert_eq!((va, vb), (Verdict::Forward, Verdict::Forward));
        assert_eq!(oa, ob, "two load balancers agree");
        assert!(checksums_ok(&oa));
        *per.entry(flow_of(&oa).dst).or_default() += 1;
        // The choice is the table's entry for the flow's hash.
        if i < 20 {
            let t = factory.maglev_table(0).unwrap();
            let idx = t.lookup(flow_hash(&flow_of(&syn)));
            assert_eq!(flow_of(&oa).dst.to_string(), format!("10.2.0.{}", idx + 1));
        }
    }
    assert_eq!(per.len(), 3);
    for (be, n) in &per {
        let share = *n as f64 / flows as f64;
        assert!((0.28..0.39).contains(&share), "{be}: {share}");
    }
    // Least-loaded counts are kept for Maglev VIPs too.
    let active: i64 = a.nf.backend_stats().iter().map(|s| s.active).sum();
    assert_eq!(active, flows as i64);
}

fn config_error(text: &str) -> (String, String) {
    let r = lb::Config::from_table(&table(text)).and_then(|c| lb::Factory::new(&c));
    match r {
        Err(BuildError::Config { nf, key, reason }) => {
            assert_eq!(nf, "lb");
            (key, reason)
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted: {text}"),
    }
}

#[test]
fn configuration_errors_name_the_key() {
    let vip = |rest: &str| format!(r#"vips = [{{ vip = "203.0.113.10", port = 80, {rest} }}]"#);
    let cases = [
        ("".to_string(), "vips", "vips"),
        ("vips = []".to_string(), "vips", "no VIPs"),
        ("vips = [{ vip = \"203.0.113.10\", port = 80 }]".to_string(), "vips[0].backends", "backends"),
        ("weights = 1\nvips = []".to_string(), "weights", "weights"),
        (vip(r#"backends = ["10.1.0.1"], colour = 1"#), "vips[0].colour", "colour"),
        (vip(r#"backends = []"#), "vips[0].backends", "no backends"),
        (vip(r#"backends = ["10.1.0.1", "10.1.0.1:80"]"#), "vips[0].backends", "twice"),
        (vip(r#"backends = ["10.1.0.300"]"#), "vips[0].backends", "10.1.0.300"),
        (vip(r#"backends = ["2001:db8::1"]"#), "vips[0].backends", "family"),
        (vip(r#"backends = ["10.1.0.1:0"]"#), "vips[0].backends", "port 0"),
        (vip(r#"backends = ["10.1.0.1"], proto = "sctp""#), "vips[0].proto", "sctp"),
        (vip(r#"backends = ["10.1.0.1"], method = "random""#), "vips[0].method", "random"),
        (vip(r#"backends = ["10.1.0.1"], table_size = 7"#), "vips[0].table_size", "maglev"),
        (vip(r#"backends = ["10.1.0.1"], method = "maglev", table_size = 100"#), "vips[0].table_size", "prime"),
        (vip(r#"backends = ["10.1.0.1", "10.1.0.2", "10.1.0.3"], method = "maglev", table_size = 2"#), "vips[0].table_size", "below"),
        (r#"vips = [{ vip = "nowhere", port = 80, backends = ["10.1.0.1"] }]"#.to_string(), "vips[0].vip", "nowhere"),
        (r#"vips = [{ vip = "203.0.113.10", port = 0, backends = ["10.1.0.1"] }]"#.to_string(), "vips[0].port", "port"),
        (r#"vips = [{ vip = "203.0.113.10", port = 65536, backends = ["10.1.0.1"] }]"#.to_string(), "vips[0].port", "65536"),
        (
            r#"vips = [{ vip = "203.0.113.10", port = 80, backends = ["10.1.0.1"] }, { vip = "203.0.113.10", port = 80, backends = ["10.1.0.2"] }]"#.to_string(),
            "vips[1]",
            "twice",
        ),
        (vip(r#"backends = ["10.1.0.1"]"#) + "\ntimeouts = { tcp = \"0s\" }", "timeouts.tcp", "above zero"),
        (vip(r#"backends = ["10.1.0.1"]"#) + "\ntimeouts = { tcp = 900 }", "timeouts.tcp", "\"900s\""),
        (vip(r#"backends = ["10.1.0.1"]"#) + "\ntimeouts = { sctp = \"1s\" }", "timeouts.sctp", "sctp"),
    ];
    for (text, key, needle) in cases {
        let (k, reason) = config_error(&text);
        assert_eq!(k, key, "{text}: {reason}");
        assert!(
            reason.contains(needle),
            "{text}: {reason:?} lacks {needle:?}"
        );
    }
    // The same service on another protocol, or another port, is fine.
    let ok = r#"vips = [
        { vip = "203.0.113.10", port = 80, backends = ["10.1.0.1"] },
        { vip = "203.0.113.10", port = 80, proto = "udp", backends = ["10.1.0.1"] },
        { vip = "203.0.113.10", port = 81, backends = ["10.1.0.1"], method = "maglev", table_size = 251 },
    ]
    timeouts = { tcp = "60s", tcp_fin = "5s", udp = "10.5s" }"#;
    assert!(lb::factory(&table(ok)).is_ok());
}
