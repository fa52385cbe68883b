//! The caps of the NFs' per-flow tables (issue #37): at most `max_flows` (or
//! `max_connections`) entries per worker; at the cap a new flow ends the oldest unanswered
//! one with `early_drop` (as conntrack's), else it is refused; both counted. Bounds are
//! asserted on counts, never on timings.

mod common_fwlb;

use common_fwlb::*;

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
