//! The XDP fast path, run by the kernel (`BPF_PROG_TEST_RUN`), gives exactly the full tables'
//! verdict for every packet in both submit modes: the program's passes over its maps, the
//! slow path's answers (`XdpFastPath::serve`) carried back through the recirculation port,
//! until the packet is done, against `FullTables::reference`. The frames are checked too:
//! addresses and ports rewritten, both checksums right (recomputed from scratch).
//!
//! Needs root (loading XDP programs); skipped otherwise.

#![cfg(target_os = "linux")]

use flowstate_fastpath::full::{self, FullTables};
use flowstate_fastpath::xdp::{parse_circulation, XdpFastPath, CIRC_BYTES, MAGIC};
use flowstate_fastpath::{Headers, Mode, Outcome};
use flowstate_state::local::LocalStore;
use flowstate_testkit::{ethernet, is_root, tcp_spec, write};
use flowstate_wire::build::tcp_flags::{ACK, PSH};
use flowstate_wire::build::{FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, UdpSpec};
use proptest::prelude::*;

mod common;
use common::{packet_strategy, pipeline, rules, rules_strategy, Rules, NET};

/// The loopback interface: the port frames come in by (and, when it is set so, the
/// recirculation port: `BPF_PROG_TEST_RUN` needs an existing interface).
const LO: u32 = 1;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;
/// The egress port mapped to an interface (LO): its packets are redirected there; the others
/// go on to the kernel's routing.
const MAPPED_EGRESS: u16 = 10;

/// An Ethernet + IPv4 + TCP/UDP frame of `h` with IP identification `id`, its checksums
/// computed from scratch.
fn frame(h: &Headers, id: u16) -> Vec<u8> {
    let ip = IpSpec::V4(Ipv4Spec {
        id,
        ..Ipv4Spec::new(h.src_ip.into(), h.dst_ip.into())
    });
    let l4 = if h.proto == 6 {
        L4Spec::Tcp(tcp_spec(h.src_port, h.dst_port, 1, 2, PSH | ACK))
    } else {
        L4Spec::Udp(UdpSpec {
            src_port: h.src_port,
            dst_port: h.dst_port,
        })
    };
    write(&FrameSpec {
        ethernet: ethernet(),
        ip,
        l4,
        payload: Payload::Bytes(b"table pipeline"),
        min_len: 0,
    })
}

/// The packet's fate in the kernel: the outcome, the frame that left, and its circulations.
fn run(
    xdp: &mut XdpFastPath,
    slow: &mut FullTables,
    h: &Headers,
    id: u16,
) -> Result<(Outcome, Option<Vec<u8>>, u32), TestCaseError> {
    let tables = xdp.pipeline().tables.len();
    let mut input = frame(h, id);
    let mut ingress_is_recirculation = false;
    let mut circulations = 0;
    loop {
        xdp.set_recirculation_port(if ingress_is_recirculation { LO } else { 0 })
            .unwrap();
        let (action, out) = xdp.test_run(LO, &input).unwrap();
        if out.get(..2) == Some(&MAGIC.to_ne_bytes()[..]) {
            // A miss: to the slow path (no socket here, so the redirect falls back to a drop).
            prop_assert_eq!(action, XDP_DROP);
            let (hdr, _, packet) = parse_circulation(&out, tables).unwrap();
            prop_assert_eq!(usize::from(hdr.circulations), circulations as usize + 1);
            prop_assert_eq!(hdr.ifindex, LO);
            prop_assert!(out.len() > CIRC_BYTES);
            prop_assert_eq!(packet.len(), frame(h, id).len());
            circulations += 1;
            prop_assert!(
                circulations as usize <= tables,
                "more circulations than tables"
            );
            let mut back = Vec::new();
            xdp.serve(slow, &out, &mut back).unwrap();
            input = back;
            ingress_is_recirculation = true;
            continue;
        }
        let verdict = xdp
            .last_verdicts()
            .unwrap()
            .into_iter()
            .find(|v| v.ip_id == id)
            .expect("the program recorded the packet's verdict");
        let outcome = Outcome {
            headers: verdict.headers,
            dropped: verdict.dropped,
        };
        return Ok(match action {
            XDP_DROP => (outcome, None, circulations),
            XDP_PASS | XDP_REDIRECT => {
                prop_assert_eq!(
                    action == XDP_REDIRECT,
                    outcome.headers.egress == MAPPED_EGRESS,
                    "redirected iff its egress port has an interface"
                );
                (outcome, Some(out), circulations)
            }
            other => return Err(TestCaseError::fail(format!("XDP action {other}"))),
        });
    }
}

fn check(
    mode: Mode,
    caches: &[usize],
    bloom_bits: usize,
    r: &Rules,
    packets: &[Headers],
) -> Result<(), TestCaseError> {
    let store = LocalStore::new();
    let p = pipeline(caches, bloom_bits);
    let loaded = full::load(&store, &p, &rules(r)).unwrap();
    let mut slow = FullTables::open(&store, &p, loaded.prefixes.clone()).unwrap();
    let mut oracle = FullTables::open(&store, &p, loaded.prefixes.clone()).unwrap();
    let mut xdp = XdpFastPath::new(&p, mode, &loaded.blooms).unwrap();
    xdp.serve_port(LO, 1).unwrap();
    xdp.set_egress(MAPPED_EGRESS, LO).unwrap();
    for (i, h) in packets.iter().enumerate() {
        let want = oracle.reference(*h).unwrap();
        let (got, out, _) = run(&mut xdp, &mut slow, h, i as u16 + 1)?;
        // The final headers: addresses and ports from the frame, protocol, mark and egress
        // from the program's record of its pass.
        prop_assert_eq!(got, want, "packet {} {:?} in {:?}", i, h, mode);
        match out {
            None => prop_assert!(want.dropped),
            Some(out) => {
                prop_assert!(!want.dropped);
                // The frame that left is the one the full tables' headers make.
                let mut expected = *h;
                expected.src_ip = want.headers.src_ip;
                expected.dst_ip = want.headers.dst_ip;
                expected.src_port = want.headers.src_port;
                expected.dst_port = want.headers.dst_port;
                prop_assert_eq!(out, frame(&expected, i as u16 + 1), "packet {}", i);
            }
        }
    }
    let c = xdp.counters().unwrap();
    prop_assert_eq!(
        c.forged + c.no_room + c.no_socket + c.unmatched,
        0,
        "{:?}",
        c
    );
    prop_assert_eq!(c.fast.done, packets.len() as u64);
    Ok(())
}

/// A circulation header is read only on the recirculation port: there, a frame without a
/// valid one is dropped and counted; on any other port, the same bytes are just a frame.
#[test]
fn circulation_headers_are_trusted_only_on_the_recirculation_port() {
    if !is_root() {
        eprintln!("skipped: loading XDP programs needs root");
        return;
    }
    let store = LocalStore::new();
    let p = pipeline(&[0; 7], 64);
    let loaded = full::load(&store, &p, &vec![Vec::new(); 7]).unwrap();
    let mut slow = FullTables::open(&store, &p, loaded.prefixes.clone()).unwrap();
    let mut xdp = XdpFastPath::new(&p, Mode::Lazy, &loaded.blooms).unwrap();
    xdp.serve_port(LO, 1).unwrap();
    let h = Headers {
        src_ip: 0x0a01_0001,
        dst_ip: NET | 9,
        src_port: 1000,
        dst_port: 5,
        proto: 17,
        ..Headers::default()
    };
    // With nothing cached, the packet goes to the slow path, which answers it.
    let (_, submitted) = xdp.test_run(LO, &frame(&h, 1)).unwrap();
    let mut answered = Vec::new();
    xdp.serve(&mut slow, &submitted, &mut answered).unwrap();

    // The answered frame on an ordinary port: not IPv4, so passed on unchanged, never read.
    let (action, out) = xdp.test_run(LO, &answered).unwrap();
    assert_eq!((action, &out), (XDP_PASS, &answered));
    assert_eq!(xdp.counters().unwrap().unmatched, 1);

    // On the recirculation port: a damaged header, a plain frame, and a pending search.
    xdp.set_recirculation_port(LO).unwrap();
    let mut bad_magic = answered.clone();
    bad_magic[0] ^= 0xff;
    let mut pending = answered.clone();
    pending[CIRC_BYTES + 1] = 0;
    for forged in [&bad_magic, &frame(&h, 2), &pending] {
        assert_eq!(xdp.test_run(LO, forged).unwrap().0, XDP_DROP);
    }
    assert_eq!(xdp.counters().unwrap().forged, 3);
    // The real answer is taken: the packet resumes past the table answered, to its next miss
    // (nothing is cached in these tables).
    let (_, again) = xdp.test_run(LO, &answered).unwrap();
    let first = parse_circulation(&submitted, p.tables.len()).unwrap().0;
    let second = parse_circulation(&again, p.tables.len()).unwrap().0;
    assert!(second.resume > first.resume, "{first:?} then {second:?}");
    assert_eq!(second.circulations, 2);
    assert_eq!(xdp.counters().unwrap().forged, 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_kernel_gives_the_full_tables_verdict_in_every_mode(
        r in rules_strategy(),
        caches in prop::collection::vec(0usize..6, 7),
        bloom_bits in prop_oneof![Just(64usize), Just(4096)],
        packets in prop::collection::vec(packet_strategy(), 1..80),
    ) {
        if !is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return Ok(());
        }
        for mode in [Mode::Busy, Mode::Lazy] {
            check(mode, &caches, bloom_bits, &r, &packets)?;
        }
    }
}
