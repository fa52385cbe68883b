//! Shared rig for the NAT tests: a NAT on the local store, a virtual clock, frame builders, and
//! checks run on every packet the NAT forwards.

#![allow(dead_code)]

use flowstate_nf::{nat, Context, Direction, NetworkFunction, Packet, Placement, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{Backend, BackendError, Connector, Partition, StateConfig};
use flowstate_testkit::{frame, icmp4};
use flowstate_wire::build::*;
use flowstate_wire::dissect::{Fragment, Network};
use flowstate_wire::{dissect, dissect::verify_checksums};
use std::net::{IpAddr, Ipv4Addr};

pub(crate) const SEC: u64 = 1_000_000_000;
pub(crate) const EXT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
pub(crate) const EXT2: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
pub(crate) const IN1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub(crate) const IN2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub(crate) const SRV1: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
pub(crate) const SRV2: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 8);

/// The local store seen as a remote one: every object goes through the store, not only the
/// worker's cache (exercises loads, flushes and store-side pools).
pub(crate) struct Remote(pub(crate) LocalStore);

impl Connector for Remote {
    fn name(&self) -> &'static str {
        "remote-local"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.0.connect()
    }
}

/// One worker's NAT with its partition and a virtual clock.
pub(crate) struct Rig {
    pub(crate) part: Partition,
    pub(crate) nat: Box<dyn NetworkFunction>,
    pub(crate) now: u64,
}

pub(crate) fn table(toml_text: &str) -> toml::Table {
    toml_text.parse().expect("test TOML parses")
}

impl Rig {
    /// Worker 0 of 1 on a fresh local store.
    pub(crate) fn new(config: &str) -> Rig {
        Rig::worker(&LocalStore::new(), config, 0, 1)
    }

    /// Worker `index` of `count` on `store`.
    pub(crate) fn worker(store: &dyn Connector, config: &str, index: u32, count: u32) -> Rig {
        let factory = nat::mvt::select_factory(&table(config)).expect("config is valid");
        let mut part = Partition::new(
            store,
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

    /// Sends `frame` through the NAT; on `Forward` checks that the dissection the NAT left
    /// matches the rewritten bytes and that checksums which verified before still verify.
    pub(crate) fn send(&mut self, frame: &mut [u8], direction: Direction) -> Verdict {
        let d = dissect(frame).expect("test frames dissect");
        self.send_as(frame, d, direction)
    }

    /// [`Rig::send`] for a later fragment whose datagram has `ports`, as the runtime's
    /// fragment tracker hands it on.
    pub(crate) fn send_tracked(
        &mut self,
        frame: &mut [u8],
        direction: Direction,
        ports: (u16, u16),
    ) -> Verdict {
        let d = dissect(frame).expect("test frames dissect");
        assert_eq!(d.fragment, Fragment::Later, "a later fragment");
        let d = d.tracked(ports);
        self.send_as(frame, d, direction)
    }

    fn send_as(
        &mut self,
        frame: &mut [u8],
        d: flowstate_wire::Dissection,
        direction: Direction,
    ) -> Verdict {
        let before = verify_checksums(frame, &d);
        let mut pkt = Packet {
            data: frame,
            dissection: d,
            direction,
        };
        let cx = Context {
            now: self.now,
            clock: 0,
            partition: 0,
        };
        let v = self.nat.process(&mut pkt, &cx);
        let left = pkt.dissection;
        if v == Verdict::Forward {
            check_forwarded(frame, &left, before);
        } else {
            assert_eq!(left, d, "a dropped packet's dissection was changed");
        }
        self.part.maybe_flush(self.now);
        v
    }

    /// Moves the clock on by `secs` seconds and lets the NAT expire sessions.
    pub(crate) fn advance(&mut self, secs: u64) {
        self.now += secs * SEC;
        self.nat.on_tick(self.now);
        self.part.maybe_flush(self.now);
    }

    /// A value of `report()`.
    pub(crate) fn report(&self, name: &str) -> i64 {
        self.nat
            .report()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no {name} in the report"))
            .1
    }
}

/// Checks a forwarded frame against the dissection the NAT left and the checksum status it had
/// on input.
pub(crate) fn check_forwarded(
    frame: &[u8],
    left: &flowstate_wire::Dissection,
    before: flowstate_wire::dissect::ChecksumStatus,
) {
    let again = dissect(frame).expect("a forwarded frame still dissects");
    assert_eq!(
        again,
        left.untracked(),
        "the NAT's dissection does not match its rewrite"
    );
    let after = verify_checksums(frame, &again);
    if before.ip == Some(true) {
        assert_eq!(after.ip, Some(true), "IPv4 header checksum broken");
    }
    if before.transport == Some(true) {
        assert_eq!(after.transport, Some(true), "transport checksum broken");
    }
    if before.transport.is_none() && again.network == Network::Ipv4 {
        assert_eq!(after.transport, None, "a UDP checksum of 0 must stay 0");
    }
}

fn v4(src: Ipv4Addr, dst: Ipv4Addr) -> IpSpec {
    IpSpec::V4(Ipv4Spec {
        id: 0x1234,
        ..Ipv4Spec::new(src, dst)
    })
}

/// A TCP segment with `flags` (see `tcp_flags`).
pub(crate) fn tcp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8) -> Vec<u8> {
    let t = TcpSpec {
        src_port: src.1,
        dst_port: dst.1,
        seq: 1000,
        ack: if flags & tcp_flags::ACK != 0 { 2000 } else { 0 },
        flags,
        window: 65535,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            ..TcpOptions::NONE
        },
    };
    frame(v4(src.0, dst.0), L4Spec::Tcp(t), b"hello")
}

/// A UDP datagram.
pub(crate) fn udp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) -> Vec<u8> {
    udp_with(src, dst, b"datagram payload")
}

/// A UDP datagram carrying `payload`.
pub(crate) fn udp_with(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), payload: &[u8]) -> Vec<u8> {
    let u = UdpSpec {
        src_port: src.1,
        dst_port: dst.1,
    };
    frame(v4(src.0, dst.0), L4Spec::Udp(u), payload)
}

/// An ICMP echo request (or reply) with identifier `id`.
pub(crate) fn echo(src: Ipv4Addr, dst: Ipv4Addr, id: u16, reply: bool) -> Vec<u8> {
    let e = EchoSpec { reply, id, seq: 7 };
    frame(v4(src, dst), L4Spec::Echo(e), b"ping ping ping")
}

/// An IPv6 UDP datagram.
pub(crate) fn udp6() -> Vec<u8> {
    let ip = IpSpec::V6(Ipv6Spec::new(
        "2001:db8::1".parse().unwrap(),
        "2001:db8::2".parse().unwrap(),
    ));
    frame(
        ip,
        L4Spec::Udp(UdpSpec {
            src_port: 1,
            dst_port: 2,
        }),
        b"v6",
    )
}

/// The IP packet of an Ethernet frame without VLAN tags (up to the IPv4 total length).
pub(crate) fn ip_packet(frame: &[u8]) -> &[u8] {
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    &frame[14..14 + total]
}

/// An ICMP error (`kind`/`code`) from `src` to `dst` quoting `quote` (an IP packet, or its start).
pub(crate) fn icmp_error(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    kind: u8,
    code: u8,
    quote: &[u8],
) -> Vec<u8> {
    let mut msg = vec![kind, code, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(quote);
    icmp4(src, dst, false, &msg)
}

/// The flow key of a frame.
pub(crate) fn flow(frame: &[u8]) -> flowstate_wire::FlowKey {
    dissect(frame).unwrap().flow.unwrap()
}

/// Source address and port of a frame's flow.
pub(crate) fn src_of(frame: &[u8]) -> (IpAddr, u16) {
    let f = flow(frame);
    (f.src, f.src_port)
}

/// Destination address and port of a frame's flow.
pub(crate) fn dst_of(frame: &[u8]) -> (IpAddr, u16) {
    let f = flow(frame);
    (f.dst, f.dst_port)
}

/// The external port a forwarded outbound frame got, checking its address is `ext`.
pub(crate) fn ext_port(frame: &[u8], ext: Ipv4Addr) -> u16 {
    let (a, p) = src_of(frame);
    assert_eq!(
        a,
        IpAddr::V4(ext),
        "outbound source not translated to {ext}"
    );
    p
}
