//! NAT event logging (`events`): every session and mapping created and ended, ports exhausted
//! and the session limit, as JSON lines, on both tables; a bad `events` table names its key.

mod nat_support;

use flowstate_nf::nat;
use flowstate_nf::{Direction::*, Verdict};
use nat_support::*;
use std::net::Ipv4Addr;

fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn sessions_mappings_and_full_tables_are_logged_on_both_tables() {
    for table in ["state", "mvt"] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("events.jsonl");
        let config = format!(
            r#"table = "{table}"
external = ["203.0.113.1"]
ports = "5000-5002"
max_sessions = 4
early_drop = false
udp = "10s"
events = {{ json = "{}" }}"#,
            log.display()
        );
        let mut rig = Rig::new(&config);
        rig.now = 1_700_000_000 * SEC;
        let host = |i: u8| Ipv4Addr::new(10, 0, 0, i);
        let mut externals = Vec::new();
        for i in 1..=3 {
            let mut f = udp((host(i), 4000), (SRV1, 53));
            assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward);
            externals.push(ext_port(&f, EXT));
        }
        // No port left: dropped, logged once (not once per packet).
        for _ in 0..3 {
            let mut f = udp((host(4), 4000), (SRV1, 53));
            assert_eq!(
                rig.send(&mut f, Outbound),
                Verdict::Drop("nat: pool exhausted")
            );
        }
        // A second session of a mapping, then one over the limit.
        let mut f = udp((host(1), 4000), (SRV2, 53));
        assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward);
        let mut f = udp((host(1), 4000), (SRV2, 54));
        assert_eq!(
            rig.send(&mut f, Outbound),
            Verdict::Drop("nat: session limit")
        );
        rig.advance(11);
        assert_eq!(rig.report("events_lost"), 0);
        drop(rig); // the last worker: the exporter drains and flushes

        let events = lines(&log);
        let count = |kind: &str| events.iter().filter(|e| e["event"] == kind).count();
        assert_eq!(count("session-create"), 4, "{table}: {events:#?}");
        assert_eq!(count("session-delete"), 4, "{table}");
        assert_eq!(count("mapping-create"), 3, "{table}");
        assert_eq!(count("mapping-delete"), 3, "{table}");
        assert_eq!(count("ports-exhausted"), 1, "{table}");
        assert_eq!(count("quota-exceeded"), 1, "{table}");
        assert_eq!(events.len(), 16, "{table}");
        // Each session is created and deleted on the endpoint it was given.
        for (i, port) in (1..=3).zip(&externals) {
            let inside = format!("{}:4000", host(i));
            let external = format!("{EXT}:{port}");
            for kind in ["session-create", "session-delete"] {
                assert!(
                    events.iter().any(|e| e["event"] == kind
                        && e["inside"] == inside
                        && e["external"] == external
                        && e["remote"] == format!("{SRV1}:53")
                        && e["proto"] == "udp"),
                    "{table}: no {kind} of {inside} as {external}: {events:#?}"
                );
            }
        }
        let ex = events
            .iter()
            .find(|e| e["event"] == "ports-exhausted")
            .unwrap();
        assert_eq!(ex["external"], EXT.to_string());
        let q = events
            .iter()
            .find(|e| e["event"] == "quota-exceeded")
            .unwrap();
        assert_eq!(q["max_sessions"], 4);
        // Creates at the NAT's time; deletes when the sessions timed out, 11 s later.
        let first = events[0]["time_ms"].as_u64().unwrap();
        assert_eq!(first, 1_700_000_000_000);
        let last = events.last().unwrap()["time_ms"].as_u64().unwrap();
        assert_eq!(last, 1_700_000_011_000);
    }
}

#[test]
fn bad_events_tables_are_refused_naming_the_key() {
    for (events, key) in [
        ("{}", "events.ipfix"),
        ("{ json = \"/tmp/x\", queue = 0 }", "events.queue"),
        (
            "{ ipfix = \"127.0.0.1:4739\", path_mtu = 20 }",
            "events.path_mtu",
        ),
        ("{ ipfix = \"not an address\" }", "events.ipfix"),
        ("{ json = \"/tmp/x\", colour = 1 }", "events"),
    ] {
        let t = table(&format!("external = [\"203.0.113.1\"]\nevents = {events}"));
        let e = nat::factory(&t).err().expect("refused").to_string();
        assert!(e.contains(key), "{events}: {e}");
    }
    // A file that cannot be opened is refused when the first worker is built.
    let t = "external = [\"203.0.113.1\"]\nevents = { json = \"/nonexistent/dir/e.jsonl\" }";
    let factory = nat::factory(&table(t)).unwrap();
    let store = flowstate_state::local::LocalStore::new();
    let mut part =
        flowstate_state::Partition::new(&store, flowstate_state::StateConfig::default()).unwrap();
    let e = factory
        .build(
            &mut part.declare("nat"),
            flowstate_nf::Placement {
                partition: 0,
                partitions: 1,
                stage: 0,
            },
        )
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("events.json") && e.contains("/nonexistent/dir"),
        "{e}"
    );
}
