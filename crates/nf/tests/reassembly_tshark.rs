//! TCP reassembly against an independent oracle: tshark's `follow,tcp,raw`.
//!
//! Captures are built with our frame builder and pcap writer: segments out of order, retransmitted,
//! overlapping (with the same and with conflicting bytes), tiny, across the 2^32 sequence wrap,
//! in both directions. For each, the bytes of both directions after [`TcpStreams`] equal tshark's.
//!
//! tshark's overlap rule: bytes it already appended are final (later data for them is dropped),
//! and out-of-order segments are applied in arrival order once they fit. That is our `first`
//! policy, except where a segment arriving later *starts before* an earlier-buffered segment it
//! conflicts with: tshark then takes the later one (as Suricata's `bsd` does). The conflicts in
//! these captures are of the kinds where the two agree; the other kind is covered by the
//! oracle property test in `reassembly.rs`.
//!
//! ACK numbers stay at the peer's ISN + 1, so tshark never inserts its
//! "[N bytes missing in capture file]" marker.

use flowstate_io::pcap::{PcapReader, PcapWriter};
use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, PacketMeta, Source};
use flowstate_nf::reassembly::{Event, Fed, Origin, OverlapPolicy, TableConfig, TcpStreams};
use flowstate_nf::{Direction, Packet};
use flowstate_state::local::LocalStore;
use flowstate_state::{Partition, StateConfig};
use flowstate_testkit::{tcp4, tshark_or_skip};
use flowstate_wire::dissect::Transport;
use flowstate_wire::{dissect, FlowKey};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;

const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

type Ep = (Ipv4Addr, u16);

/// One segment of the capture: who sends it, its offset in the sender's stream, its bytes.
#[derive(Debug, Clone)]
struct Seg {
    from_client: bool,
    offset: u32,
    data: Vec<u8>,
}

struct Conn {
    client: Ep,
    server: Ep,
    c_isn: u32,
    s_isn: u32,
}

impl Conn {
    fn frame(&self, from_client: bool, seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
        let (src, dst, ack) = if from_client {
            (self.client, self.server, self.s_isn.wrapping_add(1))
        } else {
            (self.server, self.client, self.c_isn.wrapping_add(1))
        };
        let ack = if flags & SYN != 0 && flags & ACK == 0 {
            0
        } else {
            ack
        };
        tcp4(src, dst, seq, ack, flags, data)
    }

    /// The capture: handshake, `segs` in the order given, FINs.
    fn frames(&self, segs: &[Seg], c_len: usize, s_len: usize) -> Vec<Vec<u8>> {
        let mut f = vec![
            self.frame(true, self.c_isn, SYN, b""),
            self.frame(false, self.s_isn, SYN | ACK, b""),
            self.frame(true, self.c_isn.wrapping_add(1), ACK, b""),
        ];
        for s in segs {
            let isn = if s.from_client {
                self.c_isn
            } else {
                self.s_isn
            };
            let seq = isn.wrapping_add(1).wrapping_add(s.offset);
            f.push(self.frame(s.from_client, seq, ACK | PSH, &s.data));
        }
        let c_fin = self.c_isn.wrapping_add(1).wrapping_add(c_len as u32);
        let s_fin = self.s_isn.wrapping_add(1).wrapping_add(s_len as u32);
        f.push(self.frame(true, c_fin, ACK | FIN, b""));
        f.push(self.frame(false, s_fin, ACK | FIN, b""));
        f
    }
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::create(path).expect("create pcap");
    for (i, f) in frames.iter().enumerate() {
        let meta = PacketMeta {
            timestamp_ns: 1_700_000_000_000_000_000 + i as u64 * 1_000_000,
            wire_len: f.len() as u32,
            port: 0,
            user: 0,
        };
        w.write_packet(f, &meta).expect("write");
    }
    w.finish().expect("finish");
}

/// One `follow,tcp,raw` block: the endpoints (node 0 sent the stream's first packet) and
/// each node's bytes.
#[derive(Debug, Default)]
struct Follow {
    node0: String,
    node1: String,
    client: Vec<u8>,
    server: Vec<u8>,
}

/// tshark's reassembly of TCP streams `0..n`.
fn tshark_follow_all(path: &Path, n: usize) -> Vec<Follow> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path).arg("-q");
    for i in 0..n {
        cmd.args(["-z", &format!("follow,tcp,raw,{i}")]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("tshark prints text");
    let mut blocks = Vec::new();
    let mut cur: Option<Follow> = None;
    for line in text.lines() {
        if line.starts_with("Follow:") {
            cur = Some(Follow::default());
            continue;
        }
        let Some(f) = cur.as_mut() else { continue };
        if line.starts_with("=====") {
            blocks.extend(cur.take());
        } else if let Some(n) = line.strip_prefix("Node 0: ") {
            f.node0 = n.to_string();
        } else if let Some(n) = line.strip_prefix("Node 1: ") {
            f.node1 = n.to_string();
        } else if line.starts_with("Filter:") || line.trim().is_empty() {
        } else {
            // Node 1's chunks are indented by a tab.
            let (to, hex) = match line.strip_prefix('\t') {
                Some(h) => (&mut f.server, h),
                None => (&mut f.client, line),
            };
            let hex = hex.trim();
            assert!(hex.len() % 2 == 0, "odd hex line {line:?}");
            for i in (0..hex.len()).step_by(2) {
                to.push(u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"));
            }
        }
    }
    assert_eq!(blocks.len(), n, "one block per stream:\n{text}");
    blocks
}

/// tshark's reassembly of TCP stream 0: (client's bytes, server's bytes).
fn tshark_follow(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let f = tshark_follow_all(path, 1).pop().expect("one block");
    (f.client, f.server)
}

/// Our reassembly of the capture (read back from the file): (client's bytes, server's bytes).
fn ours(path: &Path, policy: OverlapPolicy) -> (Vec<u8>, Vec<u8>) {
    let mut part = Partition::new(&LocalStore::new(), StateConfig::default()).expect("partition");
    // Room for every scrambled segment: these captures are about order, not memory.
    let cfg = TableConfig {
        policy,
        max_islands: u16::MAX,
        max_buffered: 1 << 20,
        ..TableConfig::default()
    };
    let mut t = TcpStreams::declare(&mut part.declare("ips"), &cfg).expect("declare");
    let mut r = PcapReader::open(path).expect("open pcap");
    let (mut client, mut server) = (Vec::new(), Vec::new());
    let mut ends = 0;
    while let Some((bytes, meta)) = r.next_packet().expect("read pcap") {
        let mut frame = bytes.to_vec();
        let d = dissect(&frame).expect("dissects");
        let pkt = Packet {
            data: &mut frame,
            dissection: d,
            direction: Direction::Outbound,
        };
        t.feed(&pkt, meta.timestamp_ns, |o, e| {
            let to = if o == Origin::Client {
                &mut client
            } else {
                &mut server
            };
            match e {
                Event::Data { offset, bytes } => {
                    assert_eq!(offset, to.len() as u64);
                    to.extend_from_slice(bytes);
                }
                Event::Gap { .. } => panic!("no gap expected"),
                Event::End { .. } => ends += 1,
            }
        });
    }
    assert_eq!(ends, 2, "both directions end with their FIN");
    assert_eq!(t.engine().used(), 0);
    (client, server)
}

fn check(name: &str, conn: &Conn, segs: &[Seg], c_len: usize, s_len: usize) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{name}.pcap"));
    write_pcap(&path, &conn.frames(segs, c_len, s_len));
    let theirs = tshark_follow(&path);
    let mine = ours(&path, OverlapPolicy::First);
    assert_eq!(mine.0.len(), c_len, "{name}: client stream length");
    assert_eq!(mine.1.len(), s_len, "{name}: server stream length");
    assert!(
        mine == theirs,
        "{name}: we and tshark disagree\n ours:   {:?}\n tshark: {:?}",
        (
            String::from_utf8_lossy(&mine.0),
            String::from_utf8_lossy(&mine.1)
        ),
        (
            String::from_utf8_lossy(&theirs.0),
            String::from_utf8_lossy(&theirs.1)
        ),
    );
    mine
}

/// xorshift64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn text(len: usize, seed: u64) -> Vec<u8> {
    let words: [&[u8]; 6] = [
        b"GET ",
        b"/index.html ",
        b"HTTP/1.1\r\n",
        b"Host: a\r\n",
        b"x",
        b"\r\n",
    ];
    let mut rng = Rng(seed | 1);
    let mut v = Vec::new();
    while v.len() < len {
        v.extend_from_slice(words[rng.below(words.len())]);
    }
    v.truncate(len);
    v
}

/// Cuts a stream into segments of 1 to `max` bytes, with duplicates and overlapping re-cuts of
/// the same bytes, shuffled.
fn scramble(from_client: bool, data: &[u8], max: usize, rng: &mut Rng) -> Vec<Seg> {
    let mut segs = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let n = if rng.below(4) == 0 {
            1 + rng.below(3)
        } else {
            1 + rng.below(max)
        };
        let end = (at + n).min(data.len());
        segs.push((at, end));
        at = end;
    }
    for _ in 0..segs.len() / 3 {
        let a = rng.below(data.len());
        let b = (a + 1 + rng.below(max)).min(data.len());
        segs.push((a, b));
    }
    for i in (1..segs.len()).rev() {
        segs.swap(i, rng.below(i + 1));
    }
    segs.into_iter()
        .map(|(a, b)| Seg {
            from_client,
            offset: a as u32,
            data: data[a..b].to_vec(),
        })
        .collect()
}

fn interleave(mut a: Vec<Seg>, mut b: Vec<Seg>, rng: &mut Rng) -> Vec<Seg> {
    let mut out = Vec::new();
    a.reverse();
    b.reverse();
    while !a.is_empty() || !b.is_empty() {
        let from_a = !a.is_empty() && (b.is_empty() || rng.below(2) == 0);
        out.push(if from_a { a.pop() } else { b.pop() }.expect("one is not empty"));
    }
    out
}

/// Random scrambles of both directions, some across the sequence wrap: same bytes as tshark.
#[test]
fn scrambled_streams_agree_with_tshark() {
    if !tshark_or_skip("scrambled_streams_agree_with_tshark") {
        return;
    }
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let (c_len, s_len) = (200 + rng.below(3000), 100 + rng.below(6000));
        let (c, s) = (text(c_len, seed), text(s_len, seed + 100));
        let conn = Conn {
            client: (Ipv4Addr::new(10, 0, 0, 1), 40_000 + seed as u16),
            server: (Ipv4Addr::new(192, 0, 2, 80), 80),
            // Odd seeds wrap: the ISN sits just below 2^32.
            c_isn: if seed % 2 == 1 {
                u32::MAX - 100
            } else {
                rng.next() as u32
            },
            s_isn: if seed % 2 == 1 {
                u32::MAX - 2000
            } else {
                rng.next() as u32
            },
        };
        let max = if seed % 3 == 0 { 8 } else { 1400 };
        let segs = interleave(
            scramble(true, &c, max, &mut rng),
            scramble(false, &s, max, &mut rng),
            &mut rng,
        );
        let (mc, ms) = check(&format!("scrambled-{seed}"), &conn, &segs, c_len, s_len);
        assert_eq!((mc, ms), (c, s), "seed {seed}: the streams as sent");
    }
}

/// Conflicting bytes of the kinds where tshark keeps the first data: retransmissions of
/// reported bytes with other bytes, and a later segment starting at or after an earlier
/// buffered one.
#[test]
fn conflicting_overlaps_agree_with_tshark_under_first() {
    if !tshark_or_skip("conflicting_overlaps_agree_with_tshark_under_first") {
        return;
    }
    let seg = |from_client: bool, offset: u32, data: &[u8]| Seg {
        from_client,
        offset,
        data: data.to_vec(),
    };
    let conn = Conn {
        client: (Ipv4Addr::new(10, 0, 0, 2), 50_000),
        server: (Ipv4Addr::new(192, 0, 2, 80), 80),
        c_isn: u32::MAX - 5,
        s_isn: 1_000,
    };
    let segs = [
        seg(true, 0, b"GET /ind"),
        seg(true, 0, b"GET /EVIL"), // reported bytes resent differently, and one new byte
        seg(true, 16, b"HTTP/1.1\r\n"), // buffered
        seg(true, 16, b"XXXX"),     // same start, conflicting: the first stays
        seg(true, 20, b"YYYYYYYYYYZZ"), // starts inside it, conflicting, and longer
        seg(true, 9, b"ex.htm"),
        seg(true, 15, b"lH"), // fills the hole, overlapping the buffered "H" with an "H"
        seg(false, 4, b"/1.1 200 OK\r\n"), // buffered
        seg(false, 6, b"QQ"), // inside buffered data, conflicting
        seg(false, 0, b"HTTP"),
        seg(false, 2, b"ZZZZ"), // reported already
        seg(false, 17, b"\r\n"),
    ];
    let (c, s) = check("conflicts", &conn, &segs, 32, 19);
    assert_eq!(c, b"GET /indLex.htmlHTTP/1.1\r\nYYYYZZ");
    assert_eq!(s, b"HTTP/1.1 200 OK\r\n\r\n");
}

/// A connection's client endpoint, the client's bytes and the server's.
type Streams = ((IpAddr, u16), Vec<u8>, Vec<u8>);

/// Our reassembly of every TCP connection of a capture, by canonical flow key: (client
/// endpoint, client's bytes, server's bytes).
fn ours_all(frames: &[Vec<u8>]) -> BTreeMap<FlowKey, Streams> {
    let mut part = Partition::new(&LocalStore::new(), StateConfig::default()).expect("partition");
    let cfg = TableConfig {
        max_islands: u16::MAX,
        max_buffered: 1 << 20,
        ..TableConfig::default()
    };
    let mut t = TcpStreams::declare(&mut part.declare("ips"), &cfg).expect("declare");
    let mut all = BTreeMap::new();
    for f in frames {
        let mut frame = f.clone();
        let d = dissect(&frame).expect("dissects");
        let Some(flow) = d.flow.filter(|_| d.transport == Transport::Tcp) else {
            continue;
        };
        let pkt = Packet {
            data: &mut frame,
            dissection: d,
            direction: Direction::Outbound,
        };
        let entry = all
            .entry(flow.canonical())
            .or_insert_with(|| ((flow.src, flow.src_port), Vec::new(), Vec::new()));
        let fed = t.feed(&pkt, 0, |o, e| {
            if let Event::Data { offset, bytes } = e {
                let to = if o == Origin::Client {
                    &mut entry.1
                } else {
                    &mut entry.2
                };
                assert_eq!(offset, to.len() as u64);
                to.extend_from_slice(bytes);
            }
            assert!(!matches!(e, Event::Gap { .. }), "no gap expected");
        });
        if fed == Fed::Tcp(Origin::Client) {
            entry.0 = (flow.src, flow.src_port);
        }
    }
    assert_eq!(t.engine().counters().gaps, 0);
    all
}

/// A generated trace (the `mixed` profile: IMIX sizes, so tiny segments too; IPv4 and IPv6),
/// each flow's runs of data segments shuffled and some segments sent twice: every connection's
/// two streams equal tshark's, and equal the unshuffled trace's.
#[test]
fn generated_trace_scrambled_agrees_with_tshark() {
    if !tshark_or_skip("generated_trace_scrambled_agrees_with_tshark") {
        return;
    }
    let cfg = SynthConfig {
        flows: 30,
        packets: 3_000,
        seed: 17,
        tcp_share: 1.0,
        ipv6_share: 0.3,
        ..SynthConfig::new(Profile::Mixed)
    };
    let mut src = Synthetic::new(cfg).expect("synth");
    let mut batch = PacketBatch::new(64, 4096);
    let mut frames = Vec::new();
    while src.recv(&mut batch).expect("generate") > 0 {
        frames.extend(batch.iter().map(|(b, _)| b.to_vec()));
    }
    // Runs: consecutive packets of a flow in one direction that carry data. Within a run the
    // peer has acknowledged none of them, so any order of them is one a receiver may see.
    let info: Vec<Option<(FlowKey, bool, bool)>> = frames
        .iter()
        .map(|f| {
            let d = dissect(f).ok()?;
            let flow = d.flow.filter(|_| d.transport == Transport::Tcp)?;
            let data = d.payload_offset.is_some_and(|p| p < d.l3_end);
            Some((flow.canonical(), flow.is_canonical(), data))
        })
        .collect();
    let mut runs: BTreeMap<FlowKey, Vec<Vec<usize>>> = BTreeMap::new();
    for (i, x) in info.iter().enumerate() {
        let Some((key, side, data)) = *x else {
            continue;
        };
        let flow_runs = runs.entry(key).or_default();
        let extend = data
            && flow_runs
                .last()
                .and_then(|r| r.last())
                .is_some_and(|&j| info[j].is_some_and(|(_, s, d)| d && s == side));
        match (extend, data) {
            (true, _) => flow_runs.last_mut().expect("a run").push(i),
            (false, true) => flow_runs.push(vec![i]),
            // A packet without data ends the run of either side.
            (false, false) => flow_runs.push(vec![i]),
        }
    }
    let mut rng = Rng(0x5eed);
    let mut order: Vec<usize> = (0..frames.len()).collect();
    let mut dups = Vec::new();
    let mut shuffled = 0;
    for run in runs.values().flatten().filter(|r| r.len() > 1) {
        let mut perm = run.clone();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        shuffled += usize::from(perm != *run);
        for (pos, src) in run.iter().zip(&perm) {
            order[*pos] = *src;
        }
        // Send one segment of the run again after the run.
        dups.push((*run.last().expect("not empty"), run[rng.below(run.len())]));
    }
    assert!(shuffled > 10, "the trace has runs to shuffle");
    let mut scrambled = Vec::new();
    for (pos, &src) in order.iter().enumerate() {
        scrambled.push(frames[src].clone());
        for (after, again) in &dups {
            if *after == pos {
                scrambled.push(frames[*again].clone());
            }
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("generated.pcap");
    write_pcap(&path, &scrambled);
    let mine = ours_all(&scrambled);
    let clean = ours_all(&frames);
    let theirs = tshark_follow_all(&path, mine.len());
    let mut compared = 0;
    for f in &theirs {
        let (ip, port) = f.node0.rsplit_once(':').expect("node 0 is ip:port");
        let client: (IpAddr, u16) = (unbracket(ip), port.parse().expect("port"));
        let (ip, port) = f.node1.rsplit_once(':').expect("node 1 is ip:port");
        let server: (IpAddr, u16) = (unbracket(ip), port.parse().expect("port"));
        let key = FlowKey::new(client.0, server.0, client.1, server.1, 6).canonical();
        let (c, cb, sb) = mine.get(&key).expect("tshark's stream is one of ours");
        assert_eq!(*c, client, "{key:?}: the same client");
        assert!(
            (cb, sb) == (&f.client, &f.server),
            "{key:?}: we and tshark disagree ({} / {} bytes vs {} / {})",
            cb.len(),
            sb.len(),
            f.client.len(),
            f.server.len()
        );
        let (_, ccb, csb) = &clean[&key];
        assert_eq!(
            (ccb, csb),
            (cb, sb),
            "{key:?}: scrambling changed the streams"
        );
        compared += 1;
    }
    assert_eq!(compared, mine.len());
    eprintln!(
        "{compared} connections, {} runs shuffled, {} segments sent twice, {} bytes",
        shuffled,
        dups.len(),
        mine.values()
            .map(|(_, c, s)| c.len() + s.len())
            .sum::<usize>()
    );
    assert!(
        mine.values()
            .map(|(_, c, s)| c.len() + s.len())
            .sum::<usize>()
            > 50_000
    );
}

/// An address as tshark prints it in a node line (IPv6 in brackets).
fn unbracket(ip: &str) -> IpAddr {
    let bare = ip.trim_start_matches('[').trim_end_matches(']');
    bare.parse()
        .unwrap_or_else(|_| panic!("{ip:?} is not an address"))
}
