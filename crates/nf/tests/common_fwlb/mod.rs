//! Shared rig for the firewall and load-balancer tests: one worker's NF on a store, a virtual
//! clock, frame builders, and checks run on every packet.

#![allow(dead_code)]

use flowstate_nf::firewall::{self, Firewall};
use flowstate_nf::lb::{self, LoadBalancer};
use flowstate_nf::portscan::{self, Portscan};
use flowstate_nf::{Context, Direction, NetworkFunction, Packet, Placement, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{Backend, BackendError, Connector, Declare, Partition, StateConfig};
use flowstate_testkit::{frame, icmp4, ip};
use flowstate_wire::build::*;
use flowstate_wire::dissect::{verify_checksums, Network};
use flowstate_wire::{dissect, Dissection, FlowKey};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

pub(crate) const SEC: u64 = 1_000_000_000;

#[allow(unused_imports)]
pub(crate) use flowstate_wire::build::tcp_flags::{ACK, FIN, PSH, RST, SYN};

pub(crate) const OUT: Direction = Direction::Outbound;
pub(crate) const IN: Direction = Direction::Inbound;

/// The local store seen as a remote one: every object goes through the store (loads, flushes,
/// offloaded counters), not only the worker's cache.
pub(crate) struct Remote(pub(crate) LocalStore);

impl Connector for Remote {
    fn name(&self) -> &'static str {
        "remote-local"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.0.connect()
    }
}

/// One worker's NF with its partition and a virtual clock.
pub(crate) struct Rig<N> {
    pub(crate) part: Partition,
    pub(crate) nf: N,
    pub(crate) now: u64,
}

pub(crate) fn table(toml_text: &str) -> toml::Table {
    toml_text.parse().expect("test TOML parses")
}

fn rig<N>(
    store: &dyn Connector,
    nf: &str,
    core: u32,
    build: impl FnOnce(&mut Declare<'_>, Placement) -> N,
) -> Rig<N> {
    let mut part = Partition::new(
        store,
        StateConfig {
            partition: core,
            ..StateConfig::default()
        },
    )
    .expect("partition");
    let nf = {
        let mut d = part.declare(nf);
        build(
            &mut d,
            Placement {
                partition: core,
                partitions: core + 1,
                stage: 0,
            },
        )
    };
    Rig { part, nf, now: 0 }
}

/// A firewall on a fresh local store.
pub(crate) fn firewall(config: &str) -> Rig<Firewall> {
    firewall_on(&LocalStore::new(), config)
}

/// A firewall on `store`.
pub(crate) fn firewall_on(store: &dyn Connector, config: &str) -> Rig<Firewall> {
    let f = firewall::Factory::new(&firewall::Config::from_table(&table(config)).expect("parses"))
        .expect("config is valid");
    rig(store, "firewall", 0, |d, w| {
        f.build_firewall(d, w).expect("builds")
    })
}

/// A load balancer on a fresh local store.
pub(crate) fn lb(config: &str) -> Rig<LoadBalancer> {
    lb_on(&LocalStore::new(), config, 0)
}

/// A load balancer on `store`, as worker `core`.
pub(crate) fn lb_on(store: &dyn Connector, config: &str, core: u32) -> Rig<LoadBalancer> {
    let f = lb::Factory::new(&lb::Config::from_table(&table(config)).expect("parses"))
        .expect("config is valid");
    rig(store, "lb", core, |d, w| f.build_lb(d, w).expect("builds"))
}

/// A portscan detector on a fresh local store.
pub(crate) fn portscan(config: &str) -> Rig<Portscan> {
    portscan_on(&LocalStore::new(), config)
}

/// A portscan detector on `store`.
pub(crate) fn portscan_on(store: &dyn Connector, config: &str) -> Rig<Portscan> {
    let f = portscan::Factory::new(&portscan::Config::from_table(&table(config)).expect("parses"))
        .expect("config is valid");
    rig(store, "portscan", 0, |d, w| {
        f.build_portscan(d, w).expect("builds")
    })
}

impl<N: NetworkFunction> Rig<N> {
    /// Sends `frame` through the NF; on `Forward` checks that the dissection the NF left
    /// matches the bytes and that checksums which verified before still verify; on `Drop`
    /// checks that nothing was changed.
    pub(crate) fn send(&mut self, frame: &mut [u8], direction: Direction) -> Verdict {
        let d = dissect(frame).expect("test frames dissect");
        self.send_as(frame, d, direction)
    }

    /// [`Rig::send`] for a later fragment whose datagram has `ports`, as the runtime's
    /// fragment tracker hands it on; the verdict.
    pub(crate) fn send_tracked(
        &mut self,
        frame: &[u8],
        direction: Direction,
        ports: (u16, u16),
    ) -> Verdict {
        let d = dissect(frame).expect("test frames dissect");
        assert_eq!(d.fragment, flowstate_wire::dissect::Fragment::Later);
        let d = d.tracked(ports);
        let mut copy = frame.to_vec();
        let v = self.send_as(&mut copy, d, direction);
        assert_eq!(copy, frame, "a fragment was changed");
        v
    }

    fn send_as(
        &mut self,
        frame: &mut [u8],
        d: flowstate_wire::Dissection,
        direction: Direction,
    ) -> Verdict {
        let before = verify_checksums(frame, &d);
        let copy = frame.to_vec();
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
        let v = self.nf.process(&mut pkt, &cx);
        let left = pkt.dissection;
        if v == Verdict::Forward {
            check_forwarded(frame, &left, before);
        } else {
            assert_eq!(left, d, "a dropped packet's dissection was changed");
            assert_eq!(frame, &copy[..], "a dropped packet was changed");
        }
        self.part.maybe_flush(self.now);
        v
    }

    /// Sends a copy of `frame` and returns the verdict and the bytes that came out.
    pub(crate) fn pass(&mut self, frame: &[u8], direction: Direction) -> (Verdict, Vec<u8>) {
        let mut f = frame.to_vec();
        let v = self.send(&mut f, direction);
        (v, f)
    }

    /// Whether a copy of `frame` is forwarded.
    pub(crate) fn passes(&mut self, frame: &[u8], direction: Direction) -> bool {
        self.pass(frame, direction).0 == Verdict::Forward
    }

    /// Moves the clock on by `secs` seconds and lets the NF expire its entries.
    pub(crate) fn advance(&mut self, secs: u64) {
        self.advance_ns(secs * SEC);
    }

    /// Moves the clock on by `ns` and lets the NF expire its entries.
    pub(crate) fn advance_ns(&mut self, ns: u64) {
        self.now += ns;
        self.nf.on_tick(self.now);
        self.part.maybe_flush(self.now);
    }

    /// A value of `report()`.
    pub(crate) fn report(&self, name: &str) -> i64 {
        self.nf
            .report()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no {name} in the report"))
            .1
    }

    /// A labelled report entry (`backend_active` of backend `value`).
    pub(crate) fn labelled(&self, name: &str, value: &str) -> i64 {
        self.nf
            .report_labelled()
            .into_iter()
            .find(|l| l.name == name && l.value == value)
            .unwrap_or_else(|| panic!("no {name}{{{value}}} in the report"))
            .count
    }
}

/// Checks a forwarded frame against the dissection the NF left and the checksum status it had
/// on input.
pub(crate) fn check_forwarded(
    frame: &[u8],
    left: &Dissection,
    before: flowstate_wire::dissect::ChecksumStatus,
) {
    let again = dissect(frame).expect("a forwarded frame still dissects");
    assert_eq!(
        again,
        left.untracked(),
        "the dissection does not match the bytes"
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

/// Both checksums of a frame verify.
pub(crate) fn checksums_ok(frame: &[u8]) -> bool {
    let d = dissect(frame).expect("dissects");
    let st = verify_checksums(frame, &d);
    st.ip != Some(false) && st.transport == Some(true)
}

/// The flow key of a frame.
pub(crate) fn flow_of(frame: &[u8]) -> FlowKey {
    dissect(frame).expect("dissects").flow.expect("has a flow")
}

pub(crate) fn sa(s: &str) -> SocketAddr {
    s.parse().expect("test socket address")
}

/// A TCP segment `src` → `dst` (`"10.0.0.1:40000"`, `"[2001:db8::1]:80"`) with `flags`.
pub(crate) fn tcp(src: &str, dst: &str, flags: u8) -> Vec<u8> {
    tcp_data(src, dst, flags, b"")
}

/// A TCP segment with data.
pub(crate) fn tcp_data(src: &str, dst: &str, flags: u8, data: &[u8]) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    frame(
        ip(s.ip(), d.ip()),
        L4Spec::Tcp(TcpSpec {
            src_port: s.port(),
            dst_port: d.port(),
            seq: 1000,
            ack: if flags & ACK != 0 { 2000 } else { 0 },
            flags,
            window: 65535,
            urgent: 0,
            options: TcpOptions::NONE,
        }),
        data,
    )
}

/// A UDP datagram `src` → `dst` with a few bytes of data.
pub(crate) fn udp(src: &str, dst: &str) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    frame(
        ip(s.ip(), d.ip()),
        L4Spec::Udp(UdpSpec {
            src_port: s.port(),
            dst_port: d.port(),
        }),
        b"query",
    )
}

/// An ICMP (ICMPv6 between IPv6 addresses) echo request or reply.
pub(crate) fn echo(src: &str, dst: &str, id: u16, reply: bool) -> Vec<u8> {
    let (s, d): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
    frame(
        ip(s, d),
        L4Spec::Echo(EchoSpec { reply, id, seq: 1 }),
        b"ping",
    )
}

/// An ICMPv4 error (`kind`, `code`) from `from` to `to` quoting the IP packet of `quoted`
/// (an Ethernet frame): its IP header and the first 8 bytes after it (RFC 792).
pub(crate) fn icmp4_error(
    from: Ipv4Addr,
    to: Ipv4Addr,
    kind: u8,
    code: u8,
    quoted: &[u8],
) -> Vec<u8> {
    let ip = &quoted[ETHERNET_HEADER_LEN..];
    let hl = usize::from(ip[0] & 0x0f) * 4;
    let mut msg = vec![kind, code, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&ip[..(hl + 8).min(ip.len())]);
    icmp4(from, to, true, &msg)
}

/// A raw ICMPv6 message of `kind` (no body beyond 4 zero bytes), checksummed.
pub(crate) fn icmp6(src: &str, dst: &str, kind: u8) -> Vec<u8> {
    let (s, d) = (src.parse().unwrap(), dst.parse().unwrap());
    flowstate_testkit::icmp6(s, d, 255, &[kind, 0, 0, 0, 0, 0, 0, 0])
}

/// An NF built by name through the registry, as the runtime builds it.
pub(crate) struct Built(pub(crate) Box<dyn NetworkFunction>);

impl NetworkFunction for Built {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        self.0.process(pkt, cx)
    }
    fn on_tick(&mut self, now: flowstate_state::Nanos) {
        self.0.on_tick(now)
    }
    fn report(&self) -> Vec<(&'static str, i64)> {
        self.0.report()
    }
    fn gauges(&self) -> &'static [&'static str] {
        self.0.gauges()
    }
}

/// NF `nf` configured by `config` (its `[[chain]]` table without `nf`) on a fresh local
/// store.
pub(crate) fn built(nf: &'static str, config: &str) -> Rig<Built> {
    let f = flowstate_nf::registry::factory(nf, &table(config)).expect("config is valid");
    rig(&LocalStore::new(), nf, 0, |d, w| {
        Built(f.build(d, w).expect("builds"))
    })
}

/// The error naming `key` that NF `nf` gives for `config`.
pub(crate) fn config_error(nf: &str, config: &str) -> (String, String) {
    match flowstate_nf::registry::factory(nf, &table(config)) {
        Ok(_) => panic!("{nf}: {config:?} was accepted"),
        Err(flowstate_nf::BuildError::Config { key, reason, .. }) => (key, reason),
        Err(flowstate_nf::BuildError::Configs(all)) => match all.into_iter().next() {
            Some(flowstate_nf::BuildError::Config { key, reason, .. }) => (key, reason),
            other => panic!("{nf}: {other:?}"),
        },
        Err(e) => panic!("{nf}: {e}"),
    }
}
