//! Shared helpers for the synthetic-traffic tests: run a generator to the end, and parse the
//! few fields the tests need straight from the bytes (independently of `wire::dissect`),
//! verifying lengths and checksums on the way.

#![allow(dead_code, unreachable_pub)]

pub mod app;

use flowstate_io::synth::{SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, PacketMeta, Source};
use flowstate_wire::checksum::{combine, finish, pseudo_header_v4, pseudo_header_v6, sum};
use flowstate_wire::flow::proto;
use flowstate_wire::FlowKey;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every packet of the trace `cfg` describes, received in batches of `batch` packets.
pub fn generate_with(cfg: &SynthConfig, batch: usize) -> Vec<(Vec<u8>, PacketMeta)> {
    let mut synth = Synthetic::new(cfg.clone()).expect("valid config");
    let mut b = PacketBatch::new(batch, 2048);
    let mut out = Vec::new();
    loop {
        let n = synth.recv(&mut b).unwrap();
        assert_eq!(n, b.len());
        if n == 0 {
            break;
        }
        out.extend(b.iter().map(|(d, m)| (d.to_vec(), *m)));
        if !cfg.clients_only {
            assert_eq!(synth.progress(), out.len() as u64);
        }
    }
    assert_eq!(synth.recv(&mut b).unwrap(), 0, "stays exhausted");
    out
}

pub fn generate(cfg: &SynthConfig) -> Vec<(Vec<u8>, PacketMeta)> {
    generate_with(cfg, 32)
}

#[derive(Debug, Clone)]
pub struct Tcp {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub options: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Pkt {
    pub key: FlowKey,
    pub ttl: u8,
    pub tcp: Option<Tcp>,
    pub payload: Vec<u8>,
    pub src_mac: [u8; 6],
}

impl Pkt {
    pub fn v6(&self) -> bool {
        self.key.is_ipv6()
    }

    /// TCP timestamps option (TSval, TSecr), if present.
    pub fn timestamps(&self) -> Option<(u32, u32)> {
        let opts = &self.tcp.as_ref()?.options;
        let mut i = 0;
        while i < opts.len() {
            match opts[i] {
                0 => break,
                1 => i += 1,
                kind => {
                    let len = usize::from(opts[i + 1]);
                    assert!(len >= 2 && i + len <= opts.len(), "option length");
                    if kind == 8 {
                        assert_eq!(len, 10);
                        let v = u32::from_be_bytes(opts[i + 2..i + 6].try_into().unwrap());
                        let e = u32::from_be_bytes(opts[i + 6..i + 10].try_into().unwrap());
                        return Some((v, e));
                    }
                    i += len;
                }
            }
        }
        None
    }

    /// Option kinds in order (NOPs skipped).
    pub fn option_kinds(&self) -> Vec<u8> {
        let Some(t) = &self.tcp else { return vec![] };
        let (opts, mut i, mut kinds) = (&t.options, 0, vec![]);
        while i < opts.len() {
            match opts[i] {
                0 => break,
                1 => i += 1,
                k => {
                    kinds.push(k);
                    i += usize::from(opts[i + 1]);
                }
            }
        }
        kinds
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// Parses an untagged Ethernet / IPv4 or IPv6 / TCP or UDP frame, asserting that lengths,
/// padding and checksums are right.
pub fn parse(frame: &[u8]) -> Pkt {
    assert!(frame.len() >= 60, "frames are padded to 60 bytes");
    assert!(frame.len() <= 1514, "frames fit a 1500-byte MTU");
    let src_mac: [u8; 6] = frame[6..12].try_into().unwrap();
    let ethertype = be16(frame, 12);
    let ip = &frame[14..];
    let (src, dst, protocol, ttl, seg, pseudo) = match ethertype {
        0x0800 => {
            assert_eq!(ip[0], 0x45);
            assert_eq!(finish(sum(&ip[..20])), 0, "IPv4 header checksum");
            let total = usize::from(be16(ip, 2));
            assert!(total <= ip.len());
            assert!(ip[total..].iter().all(|&b| b == 0), "padding is zeros");
            if total + 14 < 60 {
                assert_eq!(frame.len(), 60);
            } else {
                assert_eq!(frame.len(), total + 14);
            }
            let s: [u8; 4] = ip[12..16].try_into().unwrap();
            let d: [u8; 4] = ip[16..20].try_into().unwrap();
            let seg = &ip[20..total];
            let pseudo = pseudo_header_v4(s, d, ip[9], seg.len() as u16);
            (
                IpAddr::V4(Ipv4Addr::from(s)),
                IpAddr::V4(Ipv4Addr::from(d)),
                ip[9],
                ip[8],
                seg,
                pseudo,
            )
        }
        0x86dd => {
            assert_eq!(ip[0] >> 4, 6);
            let plen = usize::from(be16(ip, 4));
            assert!(40 + plen <= ip.len());
            assert!(ip[40 + plen..].iter().all(|&b| b == 0));
            let s: [u8; 16] = ip[8..24].try_into().unwrap();
            let d: [u8; 16] = ip[24..40].try_into().unwrap();
            let seg = &ip[40..40 + plen];
            let pseudo = pseudo_header_v6(&s, &d, ip[6], plen as u32);
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                ip[6],
                ip[7],
                seg,
                pseudo,
            )
        }
        other => panic!("unexpected ethertype {other:#x}"),
    };
    assert_eq!(finish(combine(pseudo, sum(seg))), 0, "transport checksum");
    let sport = be16(seg, 0);
    let dport = be16(seg, 2);
    let (tcp, payload) = match protocol {
        proto::TCP => {
            let hl = usize::from(seg[12] >> 4) * 4;
            assert!(hl >= 20 && hl <= seg.len());
            let t = Tcp {
                seq: be32(seg, 4),
                ack: be32(seg, 8),
                flags: seg[13],
                window: be16(seg, 14),
                options: seg[20..hl].to_vec(),
            };
            (Some(t), seg[hl..].to_vec())
        }
        proto::UDP => {
            assert_eq!(usize::from(be16(seg, 4)), seg.len(), "UDP length");
            assert_ne!(be16(seg, 6), 0, "UDP checksum present");
            (None, seg[8..].to_vec())
        }
        p => panic!("unexpected protocol {p}"),
    };
    Pkt {
        key: FlowKey::new(src, dst, sport, dport, protocol),
        ttl,
        tcp,
        payload,
        src_mac,
    }
}
