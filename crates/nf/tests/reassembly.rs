//! TCP reassembly: properties of the core (any arrival order gives back the stream; conflicting
//! overlaps follow a naive byte-array oracle), robustness against garbage (no panic, memory
//! within its limits), and the per-flow state surviving a worker's restart on its store.

use flowstate_nf::reassembly::{
    Config, Connection, EndReason, Event, Fed, Origin, OverlapPolicy, Reassembler, Segment, Stream,
    TableConfig, TcpStreams,
};
use flowstate_nf::{Direction, Packet};
use flowstate_state::local::LocalStore;
use flowstate_state::{Backend, BackendError, Codec, Connector, Partition, StateConfig};
use flowstate_testkit::{tcp4, udp4};
use flowstate_wire::{dissect, tcp};
use proptest::prelude::*;
use proptest::sample::Index;
use std::net::Ipv4Addr;

const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const ACK: u8 = 0x10;

/// A stream as reported: bytes (gaps as `None`), checking order and contiguity.
#[derive(Debug, Default)]
struct Out {
    bytes: Vec<Option<u8>>,
    end: Option<(u64, EndReason)>,
}

impl Out {
    fn push(&mut self, e: Event<'_>) {
        let next = self.bytes.len() as u64;
        assert!(self.end.is_none(), "an event after the end: {e:?}");
        match e {
            Event::Data { offset, bytes } => {
                assert_eq!(offset, next);
                assert!(!bytes.is_empty());
                self.bytes.extend(bytes.iter().map(|b| Some(*b)));
            }
            Event::Gap { offset, len } => {
                assert_eq!(offset, next);
                assert!(len > 0 && len < 1 << 31);
                self.bytes.extend(std::iter::repeat_n(None, len as usize));
            }
            Event::End { offset, reason } => {
                assert_eq!(offset, next);
                self.end = Some((offset, reason));
            }
        }
    }

    fn data(&self) -> Vec<u8> {
        self.bytes.iter().map(|b| b.expect("no gap")).collect()
    }
}

fn seg(seq: u32, flags: u8, payload: &[u8]) -> Segment<'_> {
    Segment {
        seq,
        flags: tcp::Flags(flags),
        payload,
    }
}

/// A small deterministic shuffle (Fisher–Yates on xorshift).
fn shuffle<T>(v: &mut [T], mut seed: u64) {
    seed |= 1;
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

fn isn() -> impl Strategy<Value = u32> {
    prop_oneof![any::<u32>(), (u32::MAX - 4000)..=u32::MAX]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Any permutation of a stream's segments, with duplicates and overlapping re-cuts of the
    /// same bytes, gives back exactly the stream, under both policies.
    #[test]
    fn any_order_gives_back_the_stream(
        data in proptest::collection::vec(any::<u8>(), 0..3000),
        cuts in proptest::collection::vec(any::<Index>(), 0..40),
        extra in proptest::collection::vec((any::<Index>(), any::<Index>()), 0..20),
        isn in isn(),
        order in any::<u64>(),
        fin in any::<bool>(),
        last in any::<bool>(),
    ) {
        let n = data.len();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(n + 1)).collect();
        points.extend([0, n]);
        points.sort_unstable();
        points.dedup();
        let mut ranges: Vec<(usize, usize)> = points.windows(2).map(|w| (w[0], w[1])).collect();
        for (a, b) in &extra {
            let (a, b) = (a.index(n + 1), b.index(n + 1));
            ranges.push((a.min(b), a.max(b)));
        }
        shuffle(&mut ranges, order);
        let policy = if last { OverlapPolicy::Last } else { OverlapPolicy::First };
        let mut eng = Reassembler::new(Config { policy, ..Config::default() }, u64::MAX);
        let mut s = Stream::default();
        let mut out = Out::default();
        eng.segment(&mut s, seg(isn, SYN, b""), &mut |e| out.push(e));
        for (a, b) in &ranges {
            let seq = isn.wrapping_add(1).wrapping_add(*a as u32);
            eng.segment(&mut s, seg(seq, ACK, &data[*a..*b]), &mut |e| out.push(e));
        }
        if fin {
            let seq = isn.wrapping_add(1).wrapping_add(n as u32);
            eng.segment(&mut s, seg(seq, ACK | FIN, b""), &mut |e| out.push(e));
            prop_assert_eq!(out.end, Some((n as u64, EndReason::Fin)));
        }
        prop_assert_eq!(out.data(), data);
        prop_assert_eq!(eng.used(), 0);
        prop_assert_eq!(eng.counters().conflicting_overlaps, 0);
        prop_assert_eq!(eng.counters().gaps, 0);
    }

    /// Segments with conflicting bytes, in any order: what is reported equals a byte array
    /// filled by the policy (first: a byte's first data; last: its latest), reported up to the
    /// first byte never filled, with a byte final once reported.
    #[test]
    fn conflicting_overlaps_follow_the_oracle(
        len in 1usize..300,
        segs in proptest::collection::vec((any::<Index>(), 1usize..60, any::<u8>()), 1..40),
        isn in isn(),
        last in any::<bool>(),
    ) {
        let policy = if last { OverlapPolicy::Last } else { OverlapPolicy::First };
        let mut eng = Reassembler::new(Config { policy, ..Config::default() }, u64::MAX);
        let mut s = Stream::default();
        let mut out = Out::default();
        eng.segment(&mut s, seg(isn, SYN, b""), &mut |e| out.push(e));
        let mut arr: Vec<Option<u8>> = vec![None; len];
        let (mut reported, mut conflicts) = (0usize, 0u64);
        for (k, (at, l, fill)) in segs.iter().enumerate() {
            let start = at.index(len);
            let end = (start + l).min(len);
            // Distinct bytes per segment, so overlaps conflict.
            let payload: Vec<u8> = (start..end).map(|i| fill.wrapping_add((i * 7 + k) as u8)).collect();
            // The oracle.
            let mut conflict = false;
            for (i, b) in (start..end).zip(&payload) {
                if i < reported {
                    continue;
                }
                match arr[i] {
                    None => arr[i] = Some(*b),
                    Some(old) => {
                        conflict |= old != *b;
                        if last {
                            arr[i] = Some(*b);
                        }
                    }
                }
            }
            conflicts += u64::from(conflict);
            while reported < len && arr[reported].is_some() {
                reported += 1;
            }
            let seq = isn.wrapping_add(1).wrapping_add(start as u32);
            eng.segment(&mut s, seg(seq, ACK, &payload), &mut |e| out.push(e));
            prop_assert_eq!(out.bytes.len(), reported);
        }
        let want: Vec<u8> = arr[..reported].iter().map(|b| b.unwrap()).collect();
        prop_assert_eq!(out.data(), want);
        prop_assert_eq!(eng.counters().conflicting_overlaps, conflicts);
        prop_assert_eq!(u64::from(s.buffered_bytes()), eng.used());
    }

    /// Garbage segments on three streams: no panic, events in order, and after every call the
    /// per-stream and total limits hold and the budget's books balance.
    #[test]
    fn garbage_never_panics_and_memory_stays_bounded(
        segs in proptest::collection::vec(
            (0usize..3, any::<u32>(), any::<u8>(), 0usize..1500, any::<u8>(), any::<bool>()),
            1..200),
        policy_last in any::<bool>(),
        midstream in any::<bool>(),
    ) {
        let cfg = Config {
            policy: if policy_last { OverlapPolicy::Last } else { OverlapPolicy::First },
            max_buffered: 3000,
            max_islands: 8,
            max_window: 1 << 16,
            midstream,
        };
        let memcap = 5000;
        let mut eng = Reassembler::new(cfg, memcap);
        let mut streams = [Stream::default(), Stream::default(), Stream::default()];
        let mut outs = [Out::default(), Out::default(), Out::default()];
        let base = 0xffff_f000u32;
        for (k, (i, seq, flags, len, fill, near)) in segs.iter().enumerate() {
            // Half the segments land near the stream's sequence numbers, half anywhere.
            let seq = if *near { base.wrapping_add(seq % 20_000) } else { *seq };
            let payload = vec![fill.wrapping_add(k as u8); *len];
            let out = &mut outs[*i];
            if out.end.is_some() && flags & SYN != 0 {
                *out = Out::default(); // a new connection on the 5-tuple starts at offset 0
            }
            eng.segment(&mut streams[*i], seg(seq, *flags, &payload), &mut |e| out.push(e));
            for s in &streams {
                prop_assert!(s.buffered_bytes() <= cfg.max_buffered);
                prop_assert!(s.buffered_ranges() <= usize::from(cfg.max_islands));
            }
            prop_assert!(eng.used() <= memcap);
            let sum: u64 = streams.iter().map(|s| u64::from(s.buffered_bytes())).sum();
            prop_assert_eq!(sum, eng.used());
        }
        for s in &mut streams {
            let b = s.to_bytes();
            prop_assert_eq!(&Stream::from_bytes(&b).unwrap(), &*s);
            eng.forget(s);
        }
        prop_assert_eq!(eng.used(), 0);
    }

    /// Bytes from a store that are not a connection are an error, never a panic.
    #[test]
    fn decoding_garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Connection::from_bytes(&b);
    }
}

// ------------------------------------------------------------------------------------------
// Through the state API

/// The local store seen as a remote one: state goes through the store, not only the cache.
struct Remote(LocalStore);

impl Connector for Remote {
    fn name(&self) -> &'static str {
        "remote-local"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.0.connect()
    }
}

const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 0, 1), 40_000);
const SERVER: (Ipv4Addr, u16) = (Ipv4Addr::new(192, 0, 2, 80), 80);

fn frame(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    tcp4(src, dst, seq, 0, flags, data)
}

fn partition(store: &dyn Connector) -> Partition {
    Partition::new(store, StateConfig::default()).expect("partition")
}

fn feed(t: &mut TcpStreams, frame: &mut [u8], now: u64, out: &mut [Out; 2]) -> Fed {
    let d = dissect(frame).expect("dissects");
    let pkt = Packet {
        data: frame,
        dissection: d,
        direction: Direction::Outbound,
    };
    t.prefetch(&pkt); // only a hint
    t.feed(&pkt, now, |o, e| {
        out[usize::from(o == Origin::Server)].push(e)
    })
}

/// Half a connection on one worker, then the worker is replaced by a new one on the same store
/// (a failover): the new worker finds the buffered out-of-order data and the next expected
/// sequence numbers, and the streams come out whole.
#[test]
fn state_survives_a_new_worker_on_the_same_store() {
    let store = Remote(LocalStore::new());
    let cfg = TableConfig::default();
    let (c_isn, s_isn) = (u32::MAX - 10, 7_000u32);
    let mut frames = vec![
        frame(CLIENT, SERVER, c_isn, SYN, b""),
        frame(SERVER, CLIENT, s_isn, SYN | ACK, b""),
        frame(
            CLIENT,
            SERVER,
            c_isn.wrapping_add(1),
            ACK,
            b"GET / HTTP/1.1\r\n",
        ),
        // Out of order: buffered when the worker fails.
        frame(
            CLIENT,
            SERVER,
            c_isn.wrapping_add(1 + 16 + 6),
            ACK,
            b"\r\n\r\n",
        ),
        frame(SERVER, CLIENT, s_isn.wrapping_add(1 + 4), ACK, b" 200 OK"),
    ];
    let after = vec![
        frame(CLIENT, SERVER, c_isn.wrapping_add(1 + 16), ACK, b"Host: "),
        frame(SERVER, CLIENT, s_isn.wrapping_add(1), ACK, b"HTTP"),
        frame(CLIENT, SERVER, c_isn.wrapping_add(1 + 26), ACK | FIN, b""),
        frame(SERVER, CLIENT, s_isn.wrapping_add(1 + 11), ACK | FIN, b""),
    ];
    let mut out = [Out::default(), Out::default()];
    {
        let mut part = partition(&store);
        let mut t = TcpStreams::declare(&mut part.declare("ips"), &cfg).unwrap();
        for f in &mut frames {
            assert!(matches!(feed(&mut t, f, 1, &mut out), Fed::Tcp(_)));
        }
        assert_eq!(t.engine().used(), 4 + 7);
        t.on_tick(2);
        part.flush_all(2).unwrap();
    } // the worker is gone
    let mut part = partition(&store);
    let mut t = TcpStreams::declare(&mut part.declare("ips"), &cfg).unwrap();
    let mut f = frame(CLIENT, SERVER, 0, ACK, b"");
    let flow = dissect(&f).unwrap().flow.unwrap();
    let c = t.connection(&flow).expect("the connection is in the store");
    assert_eq!(c.stream(Origin::Client).unwrap().buffered_bytes(), 4);
    assert_eq!(t.engine().used(), 0, "nothing charged before it is used");
    assert_eq!(feed(&mut t, &mut f, 3, &mut out), Fed::Tcp(Origin::Client));
    assert_eq!(t.engine().used(), 4 + 7, "charged to the new worker");
    for mut f in after {
        feed(&mut t, &mut f, 3, &mut out);
    }
    assert_eq!(out[0].data(), b"GET / HTTP/1.1\r\nHost: \r\n\r\n");
    assert_eq!(out[1].data(), b"HTTP 200 OK");
    assert_eq!(t.engine().used(), 0);
    assert_eq!(out[0].end, Some((26, EndReason::Fin)));
    assert_eq!(out[1].end, Some((11, EndReason::Fin)));
    // Both ended: the entry lives on for the closed timeout, then expires.
    t.on_tick(3 + 61_000_000_000);
    assert_eq!(t.connections(), 0);
    let report = t.report();
    assert!(report.contains(&("connections", 0)));
}

/// A SYN nobody answers lives for the `new` timeout; once both sides sent, for the longer one.
#[test]
fn unanswered_syns_expire_sooner() {
    let mut part = partition(&LocalStore::new());
    let mut t = TcpStreams::declare(&mut part.declare("ips"), &TableConfig::default()).unwrap();
    let mut out = [Out::default(), Out::default()];
    let other = (Ipv4Addr::new(10, 0, 0, 9), 40_001);
    feed(&mut t, &mut frame(CLIENT, SERVER, 1, SYN, b""), 0, &mut out);
    feed(
        &mut t,
        &mut frame(SERVER, CLIENT, 9, SYN | ACK, b""),
        0,
        &mut out,
    );
    feed(&mut t, &mut frame(other, SERVER, 1, SYN, b""), 0, &mut out);
    assert_eq!(t.connections(), 2);
    t.on_tick(61 * 1_000_000_000);
    assert_eq!(t.connections(), 1, "the unanswered SYN expired");
    t.on_tick(601 * 1_000_000_000);
    assert_eq!(t.connections(), 0);
}

#[test]
fn non_tcp_and_malformed_are_told_apart() {
    let mut part = partition(&LocalStore::new());
    let mut t = TcpStreams::declare(&mut part.declare("ips"), &TableConfig::default()).unwrap();
    let mut buf = udp4((CLIENT.0, 1), (SERVER.0, 53), &[0; 8]);
    let mut out = [Out::default(), Out::default()];
    assert_eq!(feed(&mut t, &mut buf, 0, &mut out), Fed::NotTcp);
    assert_eq!(t.connections(), 0);
}
