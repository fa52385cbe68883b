//! The NAT on a Match-Value Table (`table = "mvt"`) against the default NAT: the same random
//! traffic (valid, mutated, garbage, ICMP errors, hairpinned packets, time passing, port
//! forwardings in the pool's range) through both,
//! under every filtering mode, refresh direction and port parity setting, must give the same verdicts, the same output
//! bytes and the same report, for one worker and for a worker of two. (About 60% of the cases
//! hairpin a packet and about 17% filter one.)

mod nat_support;

use flowstate_nf::{registry, Direction, NetworkFunction, Placement, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{Partition, StateConfig};
use flowstate_wire::build::tcp_flags;
use flowstate_wire::dissect;
use nat_support::*;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr};

const CONFIG: &str = r#"external = ["203.0.113.1", "203.0.113.2"]
ports = "1024-1030"
tcp_established = "50s"
tcp_transitory = "10s"
udp = "20s"
icmp = "5s"
max_sessions = 12
forward = [
  { proto = "tcp", external = "203.0.113.1:1026", internal = "10.0.0.3:80" },
  { proto = "udp", external = "203.0.113.2:1025-1026", internal = "10.0.0.2:53" },
]"#;

const INSIDE: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 0, 0, 1),
    Ipv4Addr::new(10, 0, 0, 2),
    Ipv4Addr::new(10, 0, 0, 3),
];
const SERVERS: [Ipv4Addr; 2] = [SRV1, SRV2];
const PORTS: [u16; 3] = [53, 80, 40000];

#[derive(Debug, Clone)]
enum Op {
    /// A valid packet from the inside.
    Out {
        proto: u8,
        host: usize,
        port: usize,
        server: usize,
        sport: usize,
        flags: u8,
    },
    /// A valid packet from a server to an external endpoint seen so far (or a guessed one).
    In {
        proto: u8,
        server: usize,
        sport: usize,
        seen: usize,
        guess: u16,
        flags: u8,
    },
    /// An ICMP error quoting the `pick`-th forwarded packet, cut to `cut` bytes, sent back
    /// where the packet came from (`back`) or on in its direction.
    Error {
        back: bool,
        pick: usize,
        cut: usize,
        kind: u8,
    },
    /// A valid packet with one byte changed.
    Mutated {
        base: Box<Op>,
        at: usize,
        xor: u8,
        inbound: bool,
    },
    /// Random bytes, optionally after a valid Ethernet/IPv4 prefix.
    Bytes {
        prefix: bool,
        bytes: Vec<u8>,
        inbound: bool,
    },
    /// A valid packet from the inside to an external endpoint seen so far (hairpinning).
    Hairpin {
        proto: u8,
        host: usize,
        port: usize,
        seen: usize,
        flags: u8,
    },
    /// Time passes.
    Advance { secs: u64 },
}

fn valid_op() -> impl Strategy<Value = Op> {
    let proto = prop_oneof![Just(6u8), Just(17u8), Just(1u8)];
    let flags = prop_oneof![
        Just(tcp_flags::SYN),
        Just(tcp_flags::SYN | tcp_flags::ACK),
        Just(tcp_flags::ACK),
        Just(tcp_flags::FIN | tcp_flags::ACK),
        Just(tcp_flags::RST),
        any::<u8>(),
    ];
    prop_oneof![
        3 => (proto.clone(), 0..3usize, 0..3usize, 0..2usize, 0..3usize, flags.clone()).prop_map(
            |(proto, host, port, server, sport, flags)| Op::Out { proto, host, port, server, sport, flags }
        ),
        3 => (proto.clone(), 0..2usize, 0..3usize, any::<usize>(), any::<u16>(), flags.clone()).prop_map(
            |(proto, server, sport, seen, guess, flags)| Op::In { proto, server, sport, seen, guess, flags }
        ),
        1 => (proto, 0..3usize, 0..3usize, any::<usize>(), flags).prop_map(
            |(proto, host, port, seen, flags)| Op::Hairpin { proto, host, port, seen, flags }
        ),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => valid_op(),
        2 => (any::<bool>(), any::<usize>(), 20..80usize, prop_oneof![Just(3u8), Just(11u8), Just(12u8), Just(5u8)])
            .prop_map(|(back, pick, cut, kind)| Op::Error { back, pick, cut, kind }),
        2 => (valid_op(), 0..80usize, 1..=255u8, any::<bool>())
            .prop_map(|(base, at, xor, inbound)| Op::Mutated { base: Box::new(base), at, xor, inbound }),
        1 => (any::<bool>(), proptest::collection::vec(any::<u8>(), 0..100), any::<bool>())
            .prop_map(|(prefix, bytes, inbound)| Op::Bytes { prefix, bytes, inbound }),
        1 => (0..30u64).prop_map(|secs| Op::Advance { secs }),
    ]
}

/// A rig for the NAT the registry builds from `config` (with its `table` key).
fn rig(config: &str, index: u32, count: u32) -> Rig {
    let factory = registry::factory("nat", &table(config)).expect("config is valid");
    let mut part = Partition::new(
        &LocalStore::new(),
        StateConfig {
            partition: index,
            ..StateConfig::default()
        },
    )
    .expect("partition");
    let nat = {
        let mut d = part.declare("nat");
        factory
            .build(
                &mut d,
                Placement {
                    partition: index,
                    partitions: count,
                    stage: 0,
                },
            )
            .expect("builds")
    };
    Rig { part, nat, now: 0 }
}

/// Both NATs fed the same packets.
struct Run {
    rig: Rig,
    mvt: Rig,
    externals: Vec<(Ipv4Addr, u16)>,
    forwarded: Vec<(Vec<u8>, Direction)>,
}

impl Run {
    /// Worker `index` of `count`, with `options` added to [`CONFIG`].
    fn new(index: u32, count: u32, options: &str) -> Run {
        Run {
            rig: rig(
                &format!("{CONFIG}\n{options}\ntable = \"state\""),
                index,
                count,
            ),
            mvt: rig(
                &format!("{CONFIG}\n{options}\ntable = \"mvt\""),
                index,
                count,
            ),
            externals: Vec::new(),
            forwarded: Vec::new(),
        }
    }

    fn build(&self, op: &Op) -> Option<(Vec<u8>, Direction)> {
        Some(match *op {
            Op::Out {
                proto,
                host,
                port,
                server,
                sport,
                flags,
            } => {
                let src = (INSIDE[host], PORTS[port]);
                let dst = (SERVERS[server], PORTS[sport]);
                let f = match proto {
                    6 => tcp(src, dst, flags),
                    17 => udp(src, dst),
                    _ => echo(src.0, dst.0, src.1, false),
                };
                (f, Direction::Outbound)
            }
            Op::In {
                proto,
                server,
                sport,
                seen,
                guess,
                flags,
            } => {
                // Mostly a reply to a packet the NAT let out, else a guess.
                let outbound: Vec<_> = self
                    .forwarded
                    .iter()
                    .filter(|(f, d)| *d == Direction::Outbound && f.get(12..14) == Some(&[8, 0]))
                    .collect();
                if seen % 4 != 0 && !outbound.is_empty() {
                    let (f, _) = outbound[seen % outbound.len()];
                    let k = flow(f);
                    let (IpAddr::V4(ext), IpAddr::V4(remote)) = (k.src, k.dst) else {
                        return None;
                    };
                    let reply = match k.proto {
                        6 => tcp((remote, k.dst_port), (ext, k.src_port), flags),
                        17 => udp((remote, k.dst_port), (ext, k.src_port)),
                        1 => echo(remote, ext, k.src_port, true),
                        _ => return None,
                    };
                    return Some((reply, Direction::Inbound));
                }
                let ext = if self.externals.is_empty() || seen % 8 == 0 {
                    (EXT, guess)
                } else {
                    self.externals[seen % self.externals.len()]
                };
                let src = (SERVERS[server], PORTS[sport]);
                let f = match proto {
                    6 => tcp(src, ext, flags),
                    17 => udp(src, ext),
                    _ => echo(src.0, ext.0, ext.1, true),
                };
                (f, Direction::Inbound)
            }
            Op::Hairpin {
                proto,
                host,
                port,
                seen,
                flags,
            } => {
                let dst = *self.externals.get(seen % self.externals.len().max(1))?;
                let src = (INSIDE[host], PORTS[port]);
                let f = match proto {
                    6 => tcp(src, dst, flags),
                    17 => udp(src, dst),
                    _ => echo(src.0, dst.0, src.1, false),
                };
                (f, Direction::Outbound)
            }
            Op::Error {
                back,
                pick,
                cut,
                kind,
            } => {
                let (quoted, went) = self.forwarded.get(pick % self.forwarded.len().max(1))?;
                if quoted.len() < 34 || quoted[12..14] != [0x08, 0x00] {
                    return None;
                }
                let ip = ip_packet(quoted);
                let ip = &ip[..cut.min(ip.len())];
                let (src, dst) = (addr(&ip[16..20]), addr(&ip[12..16]));
                // An error normally goes back to where the quoted packet came from.
                let dir = if back { went.reversed() } else { *went };
                (icmp_error(src, dst, kind, 0, ip), dir)
            }
            Op::Mutated {
                ref base,
                at,
                xor,
                inbound,
            } => {
                let (mut f, _) = self.build(base)?;
                let i = at % f.len();
                f[i] ^= xor;
                (
                    f,
                    if inbound {
                        Direction::Inbound
                    } else {
                        Direction::Outbound
                    },
                )
            }
            Op::Bytes {
                prefix,
                ref bytes,
                inbound,
            } => {
                let mut f = Vec::new();
                if prefix {
                    f.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
                    let total = (20 + bytes.len()) as u16;
                    f.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0, 0]);
                    f.extend_from_slice(&[
                        64,
                        bytes.first().copied().unwrap_or(17) % 3 * 8 % 23,
                        0,
                        0,
                    ]);
                    f.extend_from_slice(&[198, 51, 100, 7, 203, 0, 113, 1]);
                    let c = flowstate_wire::checksum::checksum(&f[14..34]);
                    f[24..26].copy_from_slice(&c.to_be_bytes());
                }
                f.extend_from_slice(bytes);
                (
                    f,
                    if inbound {
                        Direction::Inbound
                    } else {
                        Direction::Outbound
                    },
                )
            }
            Op::Advance { .. } => return None,
        })
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        if let Op::Advance { secs } = op {
            self.rig.advance(*secs);
            self.mvt.advance(*secs);
            return Ok(());
        }
        let Some((mut frame, dir)) = self.build(op) else {
            return Ok(());
        };
        if dissect(&frame).is_err() {
            return Ok(());
        }
        let mut copy = frame.clone();
        let v = self.rig.send(&mut frame, dir);
        let w = self.mvt.send(&mut copy, dir);
        prop_assert_eq!(v, w, "verdicts differ on {:?}", op);
        prop_assert_eq!(&frame, &copy, "output differs on {:?}", op);
        if v != Verdict::Forward {
            return Ok(());
        }
        let d = dissect(&frame).unwrap();
        if let (Some(f), Direction::Outbound) = (d.flow, dir) {
            if let IpAddr::V4(a) = f.src {
                if f.src_port != 0 && !self.externals.contains(&(a, f.src_port)) {
                    self.externals.push((a, f.src_port));
                }
            }
        }
        self.forwarded.push((frame, dir));
        Ok(())
    }

    fn same_reports(&self) -> Result<(), TestCaseError> {
        let mut a = self.rig.nat.report();
        let mut b = self.mvt.nat.report();
        a.sort();
        b.sort();
        prop_assert_eq!(a, b);
        // `flowstate state list`: the same sessions and mappings, with the same time left.
        for table in ["sessions", "mappings"] {
            let rows = |nf: &dyn NetworkFunction, now: u64| {
                let mut rows = Vec::new();
                nf.list(table, now, &mut rows);
                let mut text: Vec<String> = rows.iter().map(|r| format!("{r:?}")).collect();
                text.sort();
                text
            };
            let listed = rows(&*self.rig.nat, self.rig.now);
            prop_assert_eq!(&listed, &rows(&*self.mvt.nat, self.mvt.now), "{}", table);
            let key = if table == "sessions" {
                "active_sessions"
            } else {
                "active_mappings"
            };
            let reported = self.rig.nat.report().into_iter().find(|(k, _)| *k == key);
            prop_assert_eq!(
                Some(listed.len() as i64),
                reported.map(|r| r.1),
                "{}",
                table
            );
        }
        Ok(())
    }
}

fn addr(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mvt_nat_translates_exactly_like_the_default_nat(
        ops in proptest::collection::vec(op(), 1..150),
        two_workers in any::<bool>(),
        filtering in prop_oneof![
            Just("endpoint-independent"),
            Just("address-dependent"),
            Just("address-and-port-dependent"),
        ],
        refresh in prop_oneof![Just("both"), Just("outbound")],
        port_parity in any::<bool>(),
    ) {
        let options = format!(
            "filtering = \"{filtering}\"\nrefresh = \"{refresh}\"\nport_parity = {port_parity}"
        );
        let (index, count) = if two_workers { (1, 2) } else { (0, 1) };
        let mut run = Run::new(index, count, &options);
        for op in &ops {
            run.step(op)?;
            if matches!(op, Op::Advance { .. }) {
                run.same_reports()?;
            }
        }
        run.same_reports()?;
        run.rig.advance(1000);
        run.mvt.advance(1000);
        run.same_reports()?;
        prop_assert_eq!(run.mvt.report("active_sessions"), 0);
        // Every port back, and none forwarded: 1026 of .1, 1025 and 1026 of .2 (worker 1 of
        // two has 1025, 1027 and 1029 of each).
        prop_assert_eq!(run.mvt.report("pool_free"), if two_workers { 3 + 2 } else { 6 + 5 });
    }
}

/// A long scripted run: many hosts and ports, pool exhaustion, expiry and port reuse.
#[test]
fn pool_exhaustion_and_reuse_match() {
    let mut run = Run::new(0, 1, "");
    for round in 0..6u16 {
        for h in 0..3usize {
            for p in 0..3usize {
                let op = Op::Out {
                    proto: if (round + h as u16).is_multiple_of(2) {
                        17
                    } else {
                        6
                    },
                    host: h,
                    port: p,
                    server: usize::from(round % 2),
                    sport: (p + usize::from(round)) % 3,
                    flags: tcp_flags::SYN,
                };
                run.step(&op).unwrap();
                let reply = Op::In {
                    proto: 17,
                    server: 0,
                    sport: 0,
                    seen: 1 + h + p,
                    guess: 0,
                    flags: tcp_flags::SYN | tcp_flags::ACK,
                };
                run.step(&reply).unwrap();
            }
        }
        run.step(&Op::Advance {
            secs: 7 + u64::from(round) * 3,
        })
        .unwrap();
        run.same_reports().unwrap();
    }
}
