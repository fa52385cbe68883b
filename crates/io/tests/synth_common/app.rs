//! Independent checks of the application data the generator puts on well-known ports: each
//! direction's stream (TCP) or each datagram (UDP) parses exactly, by the protocol's own
//! framing, with nothing left over.

use flowstate_wire::FlowKey;
use std::net::IpAddr;

fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

fn be32(b: &[u8], at: usize) -> usize {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

/// Position just past the first `\r\n\r\n` at or after `from`.
fn head_end(s: &[u8], from: usize) -> usize {
    s[from..]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| from + p + 4)
        .expect("a complete head")
}

/// Counts of what the streams of a TCP flow held, by protocol.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TcpCounts {
    pub http_requests: usize,
    pub http_responses: usize,
    /// Content-Length of every response, in order.
    pub http_bodies: Vec<usize>,
    pub client_hellos: usize,
    pub server_hellos: usize,
}

/// Checks both streams of a TCP flow to `port`; returns what they held.
pub fn check_tcp_streams(port: u16, client: &[u8], server: &[u8]) -> TcpCounts {
    let mut n = TcpCounts::default();
    match port {
        80 | 8080 => {
            let mut at = 0;
            while at < client.len() {
                assert!(client[at..].starts_with(b"GET /"), "a request");
                let end = head_end(client, at);
                let head = std::str::from_utf8(&client[at..end]).expect("ASCII head");
                assert!(head.lines().next().unwrap().ends_with(" HTTP/1.1"));
                assert!(head.contains("\r\nHost: www.host"));
                assert!(head.contains("\r\nUser-Agent: "));
                n.http_requests += 1;
                at = end;
            }
            let mut at = 0;
            while at < server.len() {
                assert!(
                    server[at..].starts_with(b"HTTP/1.1 200 OK\r\n"),
                    "a response"
                );
                let end = head_end(server, at);
                let head = std::str::from_utf8(&server[at..end]).expect("ASCII head");
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .expect("Content-Length")
                    .parse()
                    .expect("a number");
                assert!(end + len <= server.len(), "the body is whole");
                n.http_responses += 1;
                n.http_bodies.push(len);
                at = end + len;
            }
            assert!(
                n.http_responses == n.http_requests || n.http_responses + 1 == n.http_requests,
                "{n:?}"
            );
        }
        443 | 993 => {
            for (side, s) in [(0, client), (1, server)] {
                let mut at = 0;
                let mut first = true;
                while at < s.len() {
                    assert!(at + 5 <= s.len(), "a whole record header");
                    let (ty, ver, len) = (s[at], be16(s, at + 1), be16(s, at + 3));
                    assert!(matches!(ty, 20 | 22 | 23), "content type {ty}");
                    assert!(ver == 0x0303 || (ver == 0x0301 && first && side == 0));
                    assert!((1..=16_384 + 256).contains(&len));
                    assert!(at + 5 + len <= s.len(), "a whole record");
                    if first {
                        assert_eq!(ty, 22, "a handshake first");
                        let hs = s[at + 5];
                        assert_eq!(hs, if side == 0 { 1 } else { 2 });
                        assert_eq!(be32(s, at + 5) & 0xff_ffff, len - 4, "handshake length");
                        if side == 0 {
                            n.client_hellos += 1;
                        } else {
                            n.server_hellos += 1;
                        }
                    } else if ty == 22 {
                        panic!("one handshake record per side");
                    }
                    first = false;
                    at += 5 + len;
                }
            }
        }
        22 => {
            for (side, s) in [(0, client), (1, server)] {
                if s.is_empty() {
                    continue;
                }
                assert!(s.starts_with(b"SSH-2.0-"));
                let mut at = s.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
                // Binary packets to the end: KEXINIT, the ECDH message, IGNORE packets.
                let mut kinds = Vec::new();
                while at < s.len() {
                    let (len, pad) = (be32(s, at), usize::from(s[at + 4]));
                    assert!(
                        pad >= 4 && pad + 1 < len,
                        "side {side}: padding {pad} of {len}"
                    );
                    assert!(at + 4 + len <= s.len(), "a whole packet");
                    let kind = s[at + 5];
                    if kind == 2 {
                        assert_eq!(be32(s, at + 6), len - 1 - pad - 5, "IGNORE's string");
                    }
                    kinds.push(kind);
                    at += 4 + len;
                }
                assert_eq!(at, s.len());
                assert_eq!(kinds[0], 20, "KEXINIT first");
                let ecdh = if side == 0 { 30 } else { 31 };
                assert!(kinds.iter().filter(|&&k| k == ecdh).count() <= 1);
                assert!(kinds.iter().all(|k| [20, 2, ecdh].contains(k)), "{kinds:?}");
            }
        }
        25 => {
            for l in client.split_inclusive(|&b| b == b'\n') {
                assert!(l.ends_with(b"\r\n"), "CRLF lines");
            }
            for l in server.split_inclusive(|&b| b == b'\n') {
                assert!(l.ends_with(b"\r\n"), "CRLF lines");
                assert!(l[..3].iter().all(u8::is_ascii_digit) && matches!(l[3], b' ' | b'-'));
            }
            if !client.is_empty() {
                assert!(client.starts_with(b"EHLO "));
            }
            if !server.is_empty() {
                assert!(server.starts_with(b"220"));
            }
        }
        _ => {}
    }
    n
}

/// What a UDP exchange held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UdpCounts {
    pub dns_queries: usize,
    pub dns_answers: usize,
}

/// Skips a DNS name (labels or a pointer) at `at`.
fn dns_name(m: &[u8], mut at: usize) -> usize {
    loop {
        let l = usize::from(m[at]);
        if l == 0 {
            return at + 1;
        }
        if l & 0xc0 == 0xc0 {
            return at + 2;
        }
        at += 1 + l;
    }
}

/// Walks a DNS message's sections; returns its (id, flags, question bytes, answers).
fn dns_parse(m: &[u8]) -> (usize, usize, Vec<u8>, usize) {
    let (id, flags) = (be16(m, 0), be16(m, 2));
    let (qd, an, ns, ar) = (be16(m, 4), be16(m, 6), be16(m, 8), be16(m, 10));
    assert_eq!(qd, 1);
    let q_end = dns_name(m, 12) + 4;
    let question = m[12..q_end].to_vec();
    let mut at = q_end;
    for _ in 0..an + ns + ar {
        at = dns_name(m, at);
        let rdlen = be16(m, at + 8);
        at += 10 + rdlen;
    }
    assert_eq!(at, m.len(), "the records end the message");
    (id, flags, question, an)
}

/// Checks a UDP request to `client.dst_port` and its answer (if the flow has it).
pub fn check_udp_exchange(client: &FlowKey, req: &[u8], answer: Option<&[u8]>) -> UdpCounts {
    let mut n = UdpCounts::default();
    match client.dst_port {
        53 => {
            let (id, flags, q, an) = dns_parse(req);
            assert_eq!((flags, an), (0x0100, 0), "a query with RD");
            n.dns_queries += 1;
            if let Some(a) = answer {
                let (aid, aflags, aq, aan) = dns_parse(a);
                assert_eq!((aid, aflags & 0x8000, aq), (id, 0x8000, q));
                assert!(aan >= 1);
                n.dns_answers += 1;
            }
        }
        123 => {
            assert_eq!((req.len(), req[0]), (48, 0x23), "NTPv4 client");
            if let Some(a) = answer {
                assert_eq!((a.len(), a[0]), (48, 0x24), "NTPv4 server");
                assert_eq!(a[24..32], req[40..48], "origin = client's transmit");
            }
        }
        3478 => {
            for (m, ty) in [(Some(req), 1), (answer, 0x0101)] {
                let Some(m) = m else { continue };
                assert_eq!(be16(m, 0), ty);
                assert_eq!(be16(m, 2), m.len() - 20);
                assert_eq!(be32(m, 4), 0x2112_a442);
                assert_eq!(m[8..20], req[8..20], "transaction id");
                let mut at = 20;
                while at < m.len() {
                    at += 4 + be16(m, at + 2).div_ceil(4) * 4;
                }
                assert_eq!(at, m.len());
            }
            if let Some(a) = answer {
                // XOR-MAPPED-ADDRESS first: the client's port.
                assert_eq!(be16(a, 20), 0x20);
                assert_eq!(be16(a, 26) ^ 0x2112, usize::from(client.src_port));
                if let IpAddr::V4(c) = client.src {
                    assert_eq!(be32(a, 28) as u32 ^ 0x2112_a442, u32::from(c));
                }
            }
        }
        514 => {
            for m in [Some(req), answer].into_iter().flatten() {
                let s = std::str::from_utf8(m).expect("text");
                let (pri, rest) = s[1..].split_once('>').expect("<PRI>");
                assert!(s.starts_with('<') && pri.parse::<u8>().unwrap() < 192);
                assert!(rest.starts_with("1 2026-"), "RFC 5424 version and time");
            }
        }
        443 => {
            for m in [Some(req), answer].into_iter().flatten() {
                assert_eq!(m[0] & 0xc0, 0x40, "QUIC short header");
            }
        }
        p => panic!("UDP port {p} has no protocol"),
    }
    n
}
