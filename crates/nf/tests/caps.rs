//! The caps of the NFs' per-flow tables (issue #37): at most `max_flows` (or
//! `max_connections`) entries per worker; at the cap a new flow ends the oldest unanswered
//! one with `early_drop` (as conntrack's), else it is refused; both counted. Bounds are
//! asserted on counts, never on timings.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::Verdict;

/// A UDP datagram from client `i` (10.0.0.1, port 1000 + i) to 192.0.2.1:53.
fn query(i: u16) -> Vec<u8> {
    udp(&format!("10.0.0.1:{}", 1000 + i), "192.0.2.1:53")
}

/// The answer to [`query`] `i`.
fn answer(i: u16) -> Vec<u8> {
    udp("192.0.2.1:53", &format!("10.0.0.1:{}", 1000 + i))
}

#[test]
fn monitor_holds_at_most_max_flows_and_ends_unanswered_ones_first() {
    const CAP: i64 = 4;
    const EXTRA: u16 = 6;
    for early_drop in [true, false] {
        let mut rig = built(
            "monitor",
            &format!("max_flows = {CAP}\nearly_drop = {early_drop}"),
        );
        assert_eq!(rig.report("max_flows"), CAP);
        // Flow 0 is answered; flows 1..4 are not.
        assert!(rig.passes(&query(0), OUT));
        assert!(rig.passes(&answer(0), IN));
        for i in 1..CAP as u16 {
            assert!(rig.passes(&query(i), OUT));
        }
        for i in 0..EXTRA {
            // The monitor only observes: the packet passes whether or not it is kept.
            assert!(rig.passes(&query(100 + i), OUT));
            assert!(rig.report("active_flows") <= CAP);
        }
        assert_eq!(rig.report("active_flows"), CAP);
        if early_drop {
            assert_eq!(rig.report("flows_early_dropped"), i64::from(EXTRA));
            assert_eq!(rig.report("flows_table_full"), 0);
            // Ended flows count as finished.
            assert_eq!(rig.report("finished_flows"), i64::from(EXTRA));
        } else {
            assert_eq!(rig.report("flows_early_dropped"), 0);
            assert_eq!(rig.report("flows_table_full"), i64::from(EXTRA));
        }
        // The answered flow was kept: its next packet needs no room.
        let before = rig.report("flows_early_dropped") + rig.report("flows_table_full");
        assert!(rig.passes(&query(0), OUT));
        assert_eq!(
            rig.report("flows_early_dropped") + rig.report("flows_table_full"),
            before,
            "early_drop = {early_drop}: the answered flow was ended"
        );
    }
    // Answered flows only: nothing is expendable, so even early drop refuses.
    let mut rig = built("monitor", "max_flows = 2");
    for i in 0..2 {
        assert!(rig.passes(&query(i), OUT));
        assert!(rig.passes(&answer(i), IN));
    }
    assert!(rig.passes(&query(9), OUT));
    assert_eq!(rig.report("flows_table_full"), 1);
    assert_eq!(rig.report("flows_early_dropped"), 0);
    assert_eq!(rig.report("active_flows"), 2);
}

#[test]
fn monitor_cap_keys_are_checked() {
    assert_eq!(config_error("monitor", "max_flows = 0").0, "max_flows");
    assert_eq!(config_error("monitor", "max_flows = -1").0, "max_flows");
    assert_eq!(
        config_error("monitor", "early_drop = \"yes\"").0,
        "early_drop"
    );
}

/// A load balancer with one VIP of `method`, 203.0.113.10:80 over two backends.
fn lb_capped(method: &str, extra: &str) -> Rig<flowstate_nf::lb::LoadBalancer> {
    lb(&format!(
        "vips = [{{ vip = \"203.0.113.10\", port = 80, proto = \"tcp\", backends = [\"10.1.0.1\", \"10.1.0.2\"], method = \"{method}\" }}]\n{extra}"
    ))
}

fn lb_client(i: u16) -> String {
    format!("198.51.100.1:{}", 20000 + i)
}

#[test]
fn lb_holds_at_most_max_connections_and_ends_unanswered_ones_first() {
    const VIP: &str = "203.0.113.10:80";
    const CAP: i64 = 3;
    const EXTRA: u16 = 5;
    for method in ["least-loaded", "maglev"] {
        for early_drop in [true, false] {
            let what = format!("{method}, early_drop = {early_drop}");
            let mut rig = lb_capped(
                method,
                &format!("max_connections = {CAP}\nearly_drop = {early_drop}"),
            );
            assert_eq!(rig.report("max_connections"), CAP);
            // Connection 0 is answered by its backend; 1 and 2 are not.
            let syn = tcp(&lb_client(0), VIP, SYN);
            assert!(rig.passes(&syn, IN), "{what}");
            let (addr, port) = rig.nf.backend_of(&flow_of(&syn)).expect("assigned");
            let backend = std::net::SocketAddr::new(addr, port).to_string();
            assert!(rig.passes(&tcp(&backend, &lb_client(0), SYN | ACK), OUT));
            for i in 1..CAP as u16 {
                assert!(rig.passes(&tcp(&lb_client(i), VIP, SYN), IN), "{what}");
            }
            for i in 0..EXTRA {
                let v = rig.pass(&tcp(&lb_client(100 + i), VIP, SYN), IN).0;
                if early_drop || method == "maglev" {
                    // Room was made; or Maglev's lookup table steers it without an entry.
                    assert_eq!(v, Verdict::Forward, "{what}");
                } else {
                    assert_eq!(v, Verdict::Drop(flowstate_nf::lb::reason::TABLE_FULL));
                }
                assert!(rig.nf.flows() <= CAP as usize, "{what}");
            }
            assert_eq!(rig.nf.flows(), CAP as usize, "{what}");
            let (dropped, full) = if early_drop {
                (i64::from(EXTRA), 0)
            } else {
                (0, i64::from(EXTRA))
            };
            assert_eq!(rig.report("conns_early_dropped"), dropped, "{what}");
            assert_eq!(rig.report("conns_table_full"), full, "{what}");
            // The backends' active counts are the connections kept.
            let active: i64 = rig.nf.backend_stats().iter().map(|s| s.active).sum();
            assert_eq!(active, CAP, "{what}");
            // The answered connection is still there, on its backend.
            assert!(rig.passes(&tcp(&lb_client(0), VIP, ACK), IN), "{what}");
            assert_eq!(
                rig.nf.backend_of(&flow_of(&syn)),
                Some((addr, port)),
                "{what}"
            );
            assert_eq!(rig.report("conns_early_dropped"), dropped, "{what}");
        }
    }
}

#[test]
fn lb_cap_keys_are_checked() {
    let vips = "vips = [{ vip = \"203.0.113.10\", port = 80, backends = [\"10.1.0.1\"] }]\n";
    for (extra, key) in [
        ("max_connections = 0", "max_connections"),
        ("max_connections = \"many\"", "max_connections"),
        ("early_drop = 1", "early_drop"),
        ("max_flows = 10", "max_flows"),
    ] {
        assert_eq!(
            config_error("lb", &format!("{vips}{extra}")).0,
            key,
            "{extra}"
        );
    }
}
