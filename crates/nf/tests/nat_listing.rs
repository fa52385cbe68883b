//! `flowstate state list nat.sessions|mappings`: what a running NAT lists is what it holds, and
//! what a store holds, decoded with the NAT's own codecs, is the same (without the time left,
//! which stores do not hand out).

mod nat_support;

use flowstate_nf::listing::{Cell, StoreReader};
use flowstate_nf::{nat, Direction, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::Connector;
use flowstate_wire::build::tcp_flags;
use nat_support::*;
use std::time::Duration;

const CONFIG: &str = r#"external = ["203.0.113.1"]
ports = "2000-2099"
udp = "30s""#;

#[test]
fn a_nat_lists_its_sessions_and_a_store_holds_the_same() {
    let store = LocalStore::new();
    let mut rig = Rig::worker(&Remote(store.clone()), CONFIG, 0, 1);
    let mut sent = Vec::new();
    for (src, dst, tcp) in [
        ((IN1, 40000), (SRV1, 80), true),
        ((IN1, 40001), (SRV1, 80), true),
        ((IN2, 5353), (SRV2, 53), false),
    ] {
        let mut f = if tcp {
            nat_support::tcp(src, dst, tcp_flags::SYN)
        } else {
            udp(src, dst)
        };
        assert_eq!(rig.send(&mut f, Direction::Outbound), Verdict::Forward);
        sent.push((src, dst, ext_port(&f, EXT)));
    }
    rig.advance(10);

    let mut live = Vec::new();
    rig.nat.list("sessions", rig.now, &mut live);
    live.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(live.len(), 3, "{live:?}");
    for (src, dst, ext) in &sent {
        let row = live
            .iter()
            .find(|r| r[1] == Cell::endpoint(src.0, src.1))
            .unwrap_or_else(|| panic!("no session of {src:?} in {live:?}"));
        assert_eq!(row[2], Cell::endpoint(dst.0, dst.1));
        assert_eq!(row[3], Cell::endpoint(EXT, *ext));
        let (state, left) = if dst.1 == 80 {
            // A SYN only: RFC 5382's transitory timeout (default 240 s), 10 s of it gone.
            ("opening", 230)
        } else {
            ("active", 20)
        };
        assert_eq!(row[4], Cell::Text(state));
        assert_eq!(row[5], Cell::Timeout(Duration::from_secs(left)));
    }
    let mut mappings = Vec::new();
    rig.nat.list("mappings", rig.now, &mut mappings);
    assert_eq!(
        mappings.len(),
        3,
        "one mapping per inside endpoint: {mappings:?}"
    );

    // The same from the store, after the worker flushed.
    rig.part.flush_all(rig.now).unwrap();
    let factory = nat::factory(&table(CONFIG)).unwrap();
    let mut backend = store.connect().unwrap();
    let mut stored = Vec::new();
    let mut reader = StoreReader::new(&mut *backend, "nat");
    assert!(factory
        .stored_rows("sessions", &mut reader, &mut stored)
        .unwrap());
    stored.sort_by_key(|r| format!("{r:?}"));
    for r in &mut live {
        r[5] = Cell::None;
    }
    assert_eq!(stored, live);
    let mut stored_mappings = Vec::new();
    factory
        .stored_rows("mappings", &mut reader, &mut stored_mappings)
        .unwrap();
    stored_mappings.sort_by_key(|r| format!("{r:?}"));
    mappings.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(stored_mappings, mappings);
    assert!(!factory
        .stored_rows("nope", &mut reader, &mut stored)
        .unwrap());
    assert_eq!(
        factory.tables().iter().map(|t| t.name).collect::<Vec<_>>(),
        ["sessions", "mappings", "forwards"]
    );
}
