//! The IPS against **Suricata** (installed by scripts/setup-live from bookworm-backports): the
//! same capture and the same rules through `flowstate run --eve` and `suricata -r`, and the
//! sets of (sid, flow) alerts must be equal. The capture holds connections whose requests are
//! cut into segments at random points and sent in random orders, one-byte segments,
//! overlapping retransmissions with conflicting data (the evasion Suricata's stream engine
//! exists for), responses, and UDP. Every rule keyword the IPS supports is in the rule set.
//! Skipped with a message when `suricata` is missing.

use flowstate_io::pcap::PcapWriter;
use flowstate_io::PacketMeta;
use flowstate_testkit::{run_suricata, suricata_or_skip, tcp4, udp4};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;

const SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 80);

const RULES: &str = r#"alert tcp any any -> any 80 (msg:"evil php"; flow:to_server,established; content:"GET"; depth:3; content:"/evil.php"; distance:0; within:12; classtype:web-application-attack; sid:1001; rev:2;)
alert tcp any any -> any any (msg:"stream benign"; flow:established; content:"GET BENIGN"; sid:1002; rev:1;)
alert tcp any any -> any any (msg:"stream attack"; flow:established; content:"GET ATTACK"; sid:1003; rev:1;)
alert tcp any any -> any any (msg:"cmd"; flow:to_server,established; content:"CMD.exe"; nocase; sid:1004; rev:1;)
alert tcp any 80 -> any any (msg:"ok to client"; flow:to_client,established; content:"200 OK"; offset:9; depth:6; sid:1005; rev:1;)
alert tcp any any -> any any (msg:"ok to server"; flow:from_client; content:"200 OK"; sid:1006; rev:1;)
alert tcp any any -> any 80 (msg:"upload"; flow:to_server,established; content:"post"; nocase; depth:4; content:"/upload"; within:20; fast_pattern; sid:1007; rev:1;)
alert udp any any -> any 53 (msg:"dns example"; content:"|07|example|03|com"; nocase; priority:2; sid:1008; rev:1;)
drop tcp any any -> any 80 (msg:"passwd"; flow:to_server,established; content:"/etc/passwd"; metadata:created_at 2026_11_25; reference:url,example.com; sid:1009; rev:1;)
alert tcp 10.0.0.0/8 [1024:65535] <> $EXTERNAL_NET ![22,23] (msg:"bidirectional header"; flow:established; content:"|de ad be ef|"; sid:1010; rev:1;)
alert ip any any -> any any (msg:"any ip"; content:"xyzzy"; sid:1011; rev:1;)
alert tcp any any -> any 81 (msg:"established, no content"; flow:established; sid:1012; rev:1;)
alert tcp any any -> any 81 (msg:"not established"; flow:not_established; sid:1013; rev:1;)
"#;

/// One TCP connection being written: frames with correct acknowledgments, so that Suricata
/// inspects the acknowledged stream.
struct Conn {
    client: (Ipv4Addr, u16),
    server: (Ipv4Addr, u16),
    isn: [u32; 2],
    /// Per direction, the offsets received so far (for the cumulative ACK).
    got: [Vec<(u32, u32)>; 2],
}

impl Conn {
    /// A connection from the client's `client_port` to the server's `server_port`, its
    /// handshake written.
    fn new(client_port: u16, server_port: u16, out: &mut Vec<Vec<u8>>) -> Conn {
        let c = Conn {
            client: (Ipv4Addr::new(10, 0, 0, 7), client_port),
            server: (SERVER, server_port),
            isn: [1_000 + u32::from(client_port), 900_000],
            got: [Vec::new(), Vec::new()],
        };
        out.push(tcp4(c.client, c.server, c.isn[0], 0, SYN, b""));
        out.push(tcp4(
            c.server,
            c.client,
            c.isn[1],
            c.isn[0] + 1,
            SYN | ACK,
            b"",
        ));
        out.push(tcp4(
            c.client,
            c.server,
            c.isn[0] + 1,
            c.isn[1] + 1,
            ACK,
            b"",
        ));
        c
    }

    /// Bytes of direction `d` (0: client's) in order from its start.
    fn contiguous(&self, d: usize) -> u32 {
        let mut end = 0;
        let mut ranges = self.got[d].clone();
        ranges.sort_unstable();
        for (s, e) in ranges {
            if s <= end {
                end = end.max(e);
            }
        }
        end
    }

    /// A segment of direction `d` at stream offset `off`, then the other side's ACK.
    fn send(&mut self, d: usize, off: u32, data: &[u8], out: &mut Vec<Vec<u8>>) {
        let (src, dst) = if d == 0 {
            (self.client, self.server)
        } else {
            (self.server, self.client)
        };
        let ack_of_other = self.isn[1 - d] + 1 + self.contiguous(1 - d);
        out.push(tcp4(
            src,
            dst,
            self.isn[d] + 1 + off,
            ack_of_other,
            ACK | PSH,
            data,
        ));
        self.got[d].push((off, off + data.len() as u32));
        let acked = self.isn[d] + 1 + self.contiguous(d);
        out.push(tcp4(dst, src, ack_of_other, acked, ACK, b""));
    }

    /// Both sides' FINs and their ACKs.
    fn close(&mut self, out: &mut Vec<Vec<u8>>) {
        let end = [
            self.isn[0] + 1 + self.contiguous(0),
            self.isn[1] + 1 + self.contiguous(1),
        ];
        out.push(tcp4(
            self.client,
            self.server,
            end[0],
            end[1],
            FIN | ACK,
            b"",
        ));
        out.push(tcp4(
            self.server,
            self.client,
            end[1],
            end[0] + 1,
            FIN | ACK,
            b"",
        ));
        out.push(tcp4(
            self.client,
            self.server,
            end[0] + 1,
            end[1] + 1,
            ACK,
            b"",
        ));
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// `data` cut at random points into segments, sent in a random order.
fn scrambled(c: &mut Conn, data: &[u8], rng: &mut Rng, out: &mut Vec<Vec<u8>>) {
    let mut cuts: Vec<usize> = (0..1 + rng.below(4))
        .map(|_| 1 + rng.below(data.len() - 1))
        .collect();
    cuts.extend([0, data.len()]);
    cuts.sort_unstable();
    cuts.dedup();
    let mut segs: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
    for i in (1..segs.len()).rev() {
        segs.swap(i, rng.below(i + 1));
    }
    for (s, e) in segs {
        c.send(0, s as u32, &data[s..e], out);
    }
}

/// The capture's frames.
fn capture() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut port = 40_000;
    let mut next_port = || {
        port += 1;
        port
    };
    let requests: [&[u8]; 6] = [
        b"GET /evil.php HTTP/1.0\r\nHost: x\r\n\r\n",
        b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n",
        b"POST /api/upload HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /run?c=cmd.EXE%20/c HTTP/1.0\r\n\r\n",
        b"GET /../../etc/passwd HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.0\r\nX: \xde\xad\xbe\xef\r\n\r\n",
    ];
    // Every request, several times, each cut and shuffled differently.
    for _ in 0..6 {
        for r in requests {
            let mut c = Conn::new(next_port(), 80, &mut out);
            scrambled(&mut c, r, &mut rng, &mut out);
            c.send(
                1,
                0,
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                &mut out,
            );
            c.close(&mut out);
        }
    }
    // One byte a segment.
    let mut c = Conn::new(next_port(), 80, &mut out);
    for (i, b) in b"GET /x?cmd.exe HTTP/1.0\r\n\r\n".iter().enumerate() {
        c.send(0, i as u32, &[*b], &mut out);
    }
    c.close(&mut out);
    // Overlap with conflicting data: BENIGN ahead of its hole, an ATTACK copy over it, then
    // the hole. The stream has the first copy (as both engines keep it); the packet carrying
    // the second is inspected too.
    let mut c = Conn::new(next_port(), 80, &mut out);
    c.send(0, 4, b"BENIGN\r\n", &mut out);
    c.send(0, 4, b"ATTACK\r\n", &mut out);
    c.send(0, 0, b"GET ", &mut out);
    c.close(&mut out);
    // A response that is not "200 OK" where the rule looks.
    let mut c = Conn::new(next_port(), 80, &mut out);
    c.send(0, 0, b"GET / HTTP/1.0\r\n\r\n", &mut out);
    c.send(
        1,
        0,
        b"HTTP/1.1 404 Not Found (not 200 OK)\r\n\r\n",
        &mut out,
    );
    c.close(&mut out);
    // Port 81: a handshake that completes, and one answered by SYN/ACK and then reset
    // (established for neither tool).
    let mut c = Conn::new(next_port(), 81, &mut out);
    c.close(&mut out);
    let half = (Ipv4Addr::new(10, 0, 0, 8), next_port());
    let srv = (SERVER, 81);
    out.push(tcp4(half, srv, 77, 0, SYN, b""));
    out.push(tcp4(srv, half, 500, 78, SYN | ACK, b""));
    out.push(tcp4(half, srv, 78, 0, RST, b""));
    // UDP: a DNS-like query in mixed case, and an unrelated datagram carrying xyzzy.
    let client = (Ipv4Addr::new(10, 0, 0, 9), 5353);
    out.push(udp4(
        client,
        (Ipv4Addr::new(192, 0, 2, 53), 53),
        b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07ExAmple\x03COM\x00\x00\x01\x00\x01",
    ));
    out.push(udp4(
        client,
        (Ipv4Addr::new(192, 0, 2, 54), 9999),
        b"say xyzzy",
    ));
    out
}

/// The (sid, flow) pairs of an EVE file's alerts; a flow is its endpoints, smaller first.
fn alerts(eve: &Path) -> BTreeSet<(u64, String)> {
    std::fs::read_to_string(eve)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event_type"] == "alert")
        .map(|e| {
            let a = endpoint(&e["src_ip"], &e["src_port"]);
            let b = endpoint(&e["dest_ip"], &e["dest_port"]);
            let (x, y) = if a < b { (a, b) } else { (b, a) };
            let flow = format!("{} {x} {y}", e["proto"]);
            (e["alert"]["signature_id"].as_u64().unwrap(), flow)
        })
        .collect()
}

#[test]
fn the_ips_and_suricata_alert_on_the_same_rules_and_flows() {
    if !suricata_or_skip("the_ips_and_suricata_alert_on_the_same_rules_and_flows") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("ips.pcap");
    let mut w = PcapWriter::create(&pcap).unwrap();
    for (i, f) in capture().iter().enumerate() {
        let meta = PacketMeta {
            timestamp_ns: 1_700_000_000_000_000_000 + i as u64 * 1_000_000,
            wire_len: f.len() as u32,
            port: 0,
            user: 0,
        };
        w.write_packet(f, &meta).unwrap();
    }
    w.finish().unwrap();
    let rules = dir.path().join("test.rules");
    std::fs::write(&rules, RULES).unwrap();

    let suricata_log = dir.path().join("suricata");
    std::fs::create_dir_all(&suricata_log).unwrap();
    // Drop rules drop, as ours do (a dropped flow's later packets are not inspected).
    run_suricata(&pcap, &rules, &suricata_log, &["--simulate-ips"]);
    let theirs = alerts(&suricata_log.join("eve.json"));

    let config = dir.path().join("ips.toml");
    std::fs::write(
        &config,
        format!(
            "[input]\npcap = {:?}\n[output]\ndiscard = true\n[runtime]\nworkers = 1\n\
             [[chain]]\nnf = \"ips\"\nrules = [{:?}]\n",
            pcap.to_str().unwrap(),
            rules.to_str().unwrap()
        ),
    )
    .unwrap();
    let eve = dir.path().join("eve.json");
    let run = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .arg("run")
        .arg(&config)
        .arg("--json")
        .arg("--eve")
        .arg(&eve)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ours = alerts(&eve);
    let sids: BTreeSet<u64> = theirs.iter().map(|(s, _)| *s).collect();
    eprintln!(
        "suricata: {} alerts over sids {sids:?}; ours: {}",
        theirs.len(),
        ours.len()
    );
    // The capture exercises the rules: most alert somewhere, and some never do.
    assert!(sids.len() >= 8, "{theirs:#?}");
    assert_eq!(
        ours,
        theirs,
        "\nonly ours: {:#?}\nonly suricata's: {:#?}",
        ours.difference(&theirs).collect::<Vec<_>>(),
        theirs.difference(&ours).collect::<Vec<_>>()
    );
}

/// An EVE endpoint as one text whatever the tool's address format (Suricata writes IPv6
/// addresses uncompressed, `2001:0db8:...`; we write RFC 5952's form).
fn endpoint(ip: &serde_json::Value, port: &serde_json::Value) -> String {
    let ip = ip.as_str().unwrap_or_default();
    let ip = ip
        .parse::<std::net::IpAddr>()
        .map_or_else(|_| ip.to_owned(), |a| a.to_string());
    format!("[{ip}]:{port}")
}
