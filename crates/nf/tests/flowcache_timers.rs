//! The flow cache and the NFs' timers ([`flowstate_nf::stage::FlowCache`],
//! [`flowstate_nf::NetworkFunction::active_until`]): a chain NAT → firewall → LB run with the
//! cache against its oracle, the same chain without it. An established flow runs the chain
//! for its first packets only, never again for time, and once it stops every NF's entry ends
//! when the oracle's does.

mod nat_support;

use flowstate_nf::stage::{FlowCacheOptions, Item, Stage};
use flowstate_nf::{registry, Direction, NfFactory, Placement};
use flowstate_state::local::LocalStore;
use flowstate_state::{Nanos, Partition, StateConfig};
use flowstate_testkit::{tcp4, udp4};
use flowstate_wire::build::tcp_flags::{ACK, PSH, SYN};
use flowstate_wire::{dissect, FlowKey};
use nat_support::{table, Rig, EXT, IN1, IN2, SRV1};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const OUT: Direction = Direction::Outbound;
const IN: Direction = Direction::Inbound;

const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 0, 5), 40000);
const CLIENT_UDP: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 0, 6), 5353);
const VIP_TCP: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 1), 443);
const VIP_UDP: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 2), 53);
const BACKEND_TCP: (Ipv4Addr, u16) = (Ipv4Addr::new(192, 0, 2, 11), 443);
const BACKEND_UDP: (Ipv4Addr, u16) = (Ipv4Addr::new(192, 0, 2, 31), 53);

/// The NFs, with idle timeouts of their own (30, 40 and 50 s: each ends at another time;
/// the NAT's UDP timeout and more in `nat`).
fn factories(nat: &str) -> Vec<Arc<dyn NfFactory>> {
    let f = |name: &str, text: &str| registry::factory(name, &table(text)).expect("builds");
    vec![
        f(
            "nat",
            &format!("external = [\"203.0.113.1\"]\ntcp_established = \"30s\"\n{nat}"),
        ),
        f(
            "firewall",
            "timeouts = { established = \"40s\", udp_unreplied = \"40s\", udp_replied = \"40s\" }",
        ),
        f(
            "lb",
            r#"vips = [
                { vip = "198.51.100.1", port = 443, proto = "tcp", backends = ["192.0.2.11"] },
                { vip = "198.51.100.2", port = 53, proto = "udp", backends = ["192.0.2.31"] },
            ]
            timeouts = { tcp = "50s", udp = "50s" }"#,
        ),
    ]
}

/// The NAT's UDP timeout for the first test.
const NAT_UDP: &str = "udp = \"30s\"";

/// One partition's stage on a local store, on a virtual clock.
struct Chain {
    part: Partition,
    stage: Stage,
}

/// What became of a packet.
#[derive(Debug, PartialEq, Eq)]
struct Sent {
    /// The frame as it left, if it did.
    out: Option<Vec<u8>>,
    /// The flow cache forwarded it.
    fast: bool,
}

impl Chain {
    fn new(nat: &str, cache: bool) -> Chain {
        let mut part =
            Partition::new(&LocalStore::new(), StateConfig::default()).expect("partition");
        let at = Placement {
            stage: 0,
            partition: 0,
            partitions: 1,
        };
        let options = cache.then_some(FlowCacheOptions {
            capacity: 1 << 10,
            refresh: Duration::from_secs(1),
        });
        let stage = Stage::build(&factories(nat), &mut part, at, options).expect("stage");
        Chain { part, stage }
    }

    fn send(&mut self, mut frame: Vec<u8>, dir: Direction, now: Nanos) -> Sent {
        let d = dissect(&frame).expect("test frames dissect");
        let mut items = [Item::new(0, d, now)];
        self.stage.run(frame.as_mut_slice(), &mut items, dir);
        self.part.maybe_flush(now);
        Sent {
            out: items[0].alive.then_some(frame),
            fast: items[0].fast,
        }
    }

    fn tick(&mut self, now: Nanos) {
        self.stage.tick(now);
        self.part.maybe_flush(now);
    }

    /// Each NF's entries, in chain order.
    fn entries(&self) -> Vec<u64> {
        self.stage.nfs().iter().map(|nf| nf.entries()).collect()
    }

    /// Each NF's packets in, in chain order.
    fn packets_in(&self) -> Vec<u64> {
        self.stage.counters().iter().map(|c| c.packets_in).collect()
    }
}

/// The source port a frame leaves with.
fn src_port(frame: &[u8]) -> u16 {
    dissect(frame)
        .ok()
        .and_then(|d| d.flow)
        .map_or(0, |f: FlowKey| f.src_port)
}

/// Both chains run the same packet; the frames that leave must be the same.
fn both(plain: &mut Chain, cached: &mut Chain, frame: Vec<u8>, dir: Direction, now: Nanos) {
    let p = plain.send(frame.clone(), dir, now);
    let c = cached.send(frame, dir, now);
    assert_eq!(c.out, p.out, "at {now} ns");
}

/// The flows of the test: a TCP connection and a UDP flow to the VIPs, each answered by its
/// backend, at 10 packets a second each way for `secs`. The TCP handshake and the first
/// packet each way of both flows run the chain: six packets.
fn traffic(plain: &mut Chain, cached: &mut Chain, secs: u64) -> Nanos {
    // Handshake, and each flow's first datagram, at the start.
    let syn = tcp4(CLIENT, VIP_TCP, 1000, 0, SYN, b"");
    let p = plain.send(syn.clone(), OUT, 0);
    let port = src_port(p.out.as_deref().expect("the SYN passes"));
    assert_eq!(cached.send(syn, OUT, 0).out, p.out);
    let nat_tcp = (EXT, port);
    let synack = tcp4(BACKEND_TCP, nat_tcp, 5000, 1001, SYN | ACK, b"");
    both(plain, cached, synack, IN, 10 * MS);
    both(
        plain,
        cached,
        tcp4(CLIENT, VIP_TCP, 1001, 5001, ACK, b""),
        OUT,
        20 * MS,
    );
    let q = plain.send(udp4(CLIENT_UDP, VIP_UDP, b"query"), OUT, 30 * MS);
    let nat_udp = (EXT, src_port(q.out.as_deref().expect("the query passes")));
    let c = cached.send(udp4(CLIENT_UDP, VIP_UDP, b"query"), OUT, 30 * MS);
    assert_eq!(c.out, q.out);
    let mut now = 0;
    let end = secs * SEC;
    while now <= end {
        match now % (100 * MS) {
            0 if now >= 100 * MS => {
                let data = tcp4(CLIENT, VIP_TCP, 1001, 5001, ACK | PSH, b"data");
                both(plain, cached, data, OUT, now);
                both(plain, cached, udp4(CLIENT_UDP, VIP_UDP, b"q"), OUT, now);
            }
            x if x == 50 * MS && now >= 100 * MS => {
                let data = tcp4(BACKEND_TCP, nat_tcp, 5001, 1005, ACK | PSH, b"back");
                both(plain, cached, data, IN, now);
                both(plain, cached, udp4(BACKEND_UDP, nat_udp, b"a"), IN, now);
            }
            _ => {}
        }
        plain.tick(now);
        cached.tick(now);
        assert_eq!(cached.entries(), plain.entries(), "at {now} ns");
        now += 10 * MS;
    }
    end
}

#[test]
fn an_established_flow_runs_the_chain_for_its_first_packets_only_and_its_timers_end_as_without_the_cache(
) {
    let mut plain = Chain::new(NAT_UDP, false);
    let mut cached = Chain::new(NAT_UDP, true);
    let end = traffic(&mut plain, &mut cached, 120);
    assert_eq!(cached.entries(), vec![2, 2, 2], "two flows in every NF");
    // 120 s at 10 packets a second each way, two flows: about 4,800 packets, of which the
    // chain ran the TCP handshake and each flow's first packet each way, never one for time.
    let ran = plain.packets_in();
    assert!(ran.iter().all(|&n| n > 4_700), "{ran:?}");
    assert_eq!(cached.packets_in(), vec![6, 6, 6]);
    assert_eq!(
        cached.stage.flow_cache_hits() + 6,
        ran[0],
        "every other packet took the cache"
    );
    // The NFs heard of each flow direction once per second of its activity.
    let renewals = cached.stage.flow_cache_renewals();
    assert!((4 * 118..=4 * 121).contains(&renewals), "{renewals}");
    assert_eq!(cached.stage.flow_cache_handbacks(), 0, "nothing ended yet");

    // The flows stop. Both chains' timers run on in steps of 1 ms: each NF's entries end at
    // the same step in both, or at most two steps earlier with the cache, which hands each
    // flow back with the start of the cache tick (2^20 ns, 1.05 ms) of its last packet. The
    // NFs' timers are exact (a heap of deadlines), so nothing else tells them apart.
    let mut gone: [[Option<Nanos>; 3]; 2] = [[None; 3]; 2];
    let mut now = end;
    while now < end + 60 * SEC {
        now += MS;
        for (k, chain) in [&mut plain, &mut cached].into_iter().enumerate() {
            chain.tick(now);
            for (j, n) in chain.entries().into_iter().enumerate() {
                if n == 0 && gone[k][j].is_none() {
                    gone[k][j] = Some(now);
                }
            }
        }
    }
    assert_eq!(
        cached.stage.flow_cache_handbacks(),
        4,
        "each flow direction once"
    );
    for (j, name) in ["nat", "firewall", "lb"].into_iter().enumerate() {
        let (Some(p), Some(c)) = (gone[0][j], gone[1][j]) else {
            panic!("{name}: entries left: {gone:?}");
        };
        assert!(
            c <= p && p - c <= 2 * MS,
            "{name}: without the cache {p} ns, with it {c} ns"
        );
    }
    // The timeouts in order (30, 40, 50 s after the last packet, outbound at `end`).
    let last = end;
    for (j, t) in [30, 40, 50].into_iter().enumerate() {
        assert_eq!(gone[0][j].map(|g| (g - last) / SEC), Some(t), "NF {j}");
    }
    assert_eq!(cached.packets_in(), vec![6, 6, 6]);
}

#[test]
fn a_flow_an_nf_no_longer_holds_leaves_the_cache_and_its_next_packet_runs_the_chain() {
    // Only outbound packets keep a NAT session alive: a flow of answers alone ends it after
    // 3 s, the cache then learns so within a refresh, and the chain drops what follows.
    let nat = "refresh = \"outbound\"\nudp = \"3s\"";
    let mut plain = Chain::new(nat, false);
    let mut cached = Chain::new(nat, true);
    let q = plain.send(udp4(CLIENT_UDP, VIP_UDP, b"query"), OUT, 0);
    let nat_udp = (EXT, src_port(q.out.as_deref().expect("the query passes")));
    assert_eq!(
        cached.send(udp4(CLIENT_UDP, VIP_UDP, b"query"), OUT, 0).out,
        q.out
    );
    let (mut plain_drop, mut cached_drop) = (None, None);
    let mut now = 0;
    while now <= 10 * SEC {
        if now % (100 * MS) == 50 * MS {
            let answer = udp4(BACKEND_UDP, nat_udp, b"a");
            let p = plain.send(answer.clone(), IN, now);
            let c = cached.send(answer, IN, now);
            if p.out.is_none() {
                plain_drop.get_or_insert(now);
            }
            match (&c.out, cached_drop) {
                (Some(out), None) => {
                    if let Some(p) = &p.out {
                        assert_eq!(out, p, "at {now} ns");
                    }
                }
                (None, None) => {
                    assert!(!c.fast, "the chain dropped it");
                    cached_drop = Some(now);
                }
                (_, Some(_)) => {
                    assert!(c.out.is_none() && !c.fast, "at {now} ns: after the drop");
                }
            }
        }
        plain.tick(now);
        cached.tick(now);
        now += 10 * MS;
    }
    let (Some(p), Some(c)) = (plain_drop, cached_drop) else {
        panic!("no drop: {plain_drop:?} {cached_drop:?}");
    };
    // The session ends 3 s after the query; the oracle drops the next answer. The cache
    // tells the NFs of the flow at least once a refresh (1 s) plus one packet's gap (100 ms),
    // and the answer after that runs the chain.
    assert_eq!(p, 3 * SEC + 50 * MS);
    assert!(c > p && c <= p + SEC + 200 * MS, "dropped from {c} ns");
    let nat = &cached.stage.counters()[0];
    assert!(
        nat.dropped
            .iter()
            .any(|&(r, n)| r == "nat: no mapping" && n > 0),
        "{nat:?}"
    );
}

/// The NAT's `active_until` on both tables: the session renewed, never to an earlier time,
/// its endpoints written into the flow; unknown and hairpinned flows refused.
#[test]
fn the_nat_extends_a_session_it_holds_and_refuses_what_it_does_not() {
    for t in ["state", "mvt"] {
        let mut rig = Rig::new(&format!(
            "external = [\"203.0.113.1\"]\nudp = \"30s\"\ntable = \"{t}\""
        ));
        let mut q = udp4((IN1, 5000), (SRV1, 53), b"q");
        assert_eq!(rig.send(&mut q, OUT), flowstate_nf::Verdict::Forward);
        let port = src_port(&q);
        let v4 = IpAddr::V4;
        let out = FlowKey::new(v4(IN1), v4(SRV1), 5000, 53, 17);
        let mut f = out;
        assert!(rig.nat.active_until(&mut f, OUT, 10 * SEC), "{t}");
        assert_eq!((f.src, f.src_port, f.dst), (v4(EXT), port, v4(SRV1)), "{t}");
        // An earlier time changes nothing.
        assert!(rig.nat.active_until(&mut out.clone(), OUT, SEC), "{t}");
        let back = FlowKey::new(v4(SRV1), v4(EXT), 53, port, 17);
        let mut b = back;
        assert!(rig.nat.active_until(&mut b, IN, 5 * SEC), "{t}");
        assert_eq!((b.dst, b.dst_port, b.src), (v4(IN1), 5000, v4(SRV1)), "{t}");
        // A hairpinned flow (to an external endpoint) is not the cache's.
        let mut h = udp4((IN2, 6000), (SRV1, 53), b"q");
        rig.send(&mut h, OUT);
        let mut pin = FlowKey::new(v4(IN1), v4(EXT), 5000, src_port(&h), 17);
        assert!(!rig.nat.active_until(&mut pin, OUT, 10 * SEC), "{t}");
        // Without it the session would end at 30 s; it ends at 40.
        rig.now = 39 * SEC;
        rig.nat.on_tick(rig.now);
        assert_eq!(rig.nat.entries(), 1, "{t}: extended to 40 s");
        rig.now = 40 * SEC;
        rig.nat.on_tick(rig.now);
        assert_eq!(rig.nat.entries(), 0, "{t}");
        assert!(
            !rig.nat.active_until(&mut out.clone(), OUT, rig.now),
            "{t}: ended"
        );
        assert!(!rig.nat.active_until(&mut back.clone(), IN, rig.now), "{t}");
    }
}
