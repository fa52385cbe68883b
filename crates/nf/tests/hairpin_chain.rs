//! A hairpinned packet in a chain (firewall → NAT → counter): the NAT turns it back inside,
//! the firewall before it sees it inbound (as nftables' forward chain sees a hairpinned
//! packet after its DNAT) and tracks that connection, the counter after it never sees it. So
//! an inside client reaches a published inside server through the external address with a
//! stateful firewall in front of the NAT.

mod nat_support;

use flowstate_nf::stage::{Item, Stage};
use flowstate_nf::{registry, Direction, NfFactory, Placement};
use flowstate_state::local::LocalStore;
use flowstate_state::{Partition, StateConfig};
use flowstate_wire::build::tcp_flags::{ACK, SYN};
use flowstate_wire::dissect;
use nat_support::{src_of, table, tcp, EXT, IN2};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

const OUT: Direction = Direction::Outbound;
const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 0, 3), 40000);
const WEB: (Ipv4Addr, u16) = (IN2, 8080);

struct Chain {
    part: Partition,
    stage: Stage,
}

impl Chain {
    fn new(firewall: &str) -> Chain {
        let f = |name: &str, text: &str| registry::factory(name, &table(text)).expect("builds");
        let chain: Vec<Arc<dyn NfFactory>> = vec![
            f("firewall", firewall),
            f(
                "nat",
                "external = [\"203.0.113.1\"]\nforward = [{ proto = \"tcp\", external = \"203.0.113.1:80\", internal = \"10.0.0.2:8080\" }]",
            ),
            f("counter", ""),
        ];
        let mut part =
            Partition::new(&LocalStore::new(), StateConfig::default()).expect("partition");
        let at = Placement {
            stage: 0,
            partition: 0,
            partitions: 1,
        };
        let stage = Stage::build(&chain, &mut part, at, None).expect("stage");
        Chain { part, stage }
    }

    /// An outbound frame through the chain: as it left, and whether it was hairpinned.
    fn send(&mut self, mut frame: Vec<u8>) -> (Option<Vec<u8>>, bool) {
        let d = dissect(&frame).expect("test frames dissect");
        let mut items = [Item::new(0, d, 1)];
        self.stage.run(frame.as_mut_slice(), &mut items, OUT);
        self.part.maybe_flush(1);
        (items[0].alive.then_some(frame), items[0].hairpinned)
    }

    fn packets_in(&self) -> Vec<u64> {
        self.stage.counters().iter().map(|c| c.packets_in).collect()
    }
}

const DENY_BUT_WEB: &str = "default_inbound = \"deny\"\nrules = [{ action = \"allow\", proto = \"tcp\", dport = 8080, direction = \"inbound\" }]";

#[test]
fn a_hairpinned_connection_passes_a_firewall_in_front_of_the_nat() {
    let mut c = Chain::new(DENY_BUT_WEB);
    let (syn, hairpinned) = c.send(tcp(CLIENT, (EXT, 80), SYN));
    let syn = syn.expect("the SYN is hairpinned to the server");
    assert!(hairpinned);
    let (ip, port) = src_of(&syn);
    assert_eq!(ip, IpAddr::V4(EXT));
    assert_eq!(syn, tcp((EXT, port), WEB, SYN));
    // The firewall saw it twice (outbound, then inbound), the counter after the NAT never.
    assert_eq!(c.packets_in(), [2, 1, 0]);
    let (answer, hairpinned) = c.send(tcp(WEB, (EXT, port), SYN | ACK));
    assert!(hairpinned);
    assert_eq!(
        answer.expect("the server's answer passes the firewall"),
        tcp((EXT, 80), CLIENT, SYN | ACK)
    );
    let (ack, _) = c.send(tcp(CLIENT, (EXT, 80), ACK));
    assert_eq!(ack.expect("the handshake ends"), tcp((EXT, port), WEB, ACK));
    assert_eq!(c.packets_in(), [6, 3, 0]);
    // Not hairpinned: leaves by the NAT and the counter.
    let (out, hairpinned) = c.send(tcp(CLIENT, (Ipv4Addr::new(198, 51, 100, 7), 443), SYN));
    assert!(out.is_some() && !hairpinned);
    assert_eq!(c.packets_in(), [7, 4, 1]);
}

#[test]
fn a_hairpinned_packet_meets_the_firewalls_inbound_policy() {
    let mut c = Chain::new("default_inbound = \"deny\"");
    let (syn, _) = c.send(tcp(CLIENT, (EXT, 80), SYN));
    assert!(syn.is_none(), "an inbound connection to 8080 is denied");
    let firewall = &c.stage.counters()[0];
    assert_eq!(firewall.packets_in, 2);
    assert_eq!(firewall.forwarded, 1);
}
