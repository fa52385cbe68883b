//! Exact packet and flow counts, whole TCP connections, UDP exchanges and valid checksums.

mod synth_common;

use flowstate_io::synth::{Profile, SizeDist, SynthConfig, Synthetic, CLIENT_MAC};
use flowstate_wire::build::tcp_flags::{ACK, FIN, PSH, RST, SYN};
use flowstate_wire::FlowKey;
use std::collections::BTreeMap;
use synth_common::{app, generate, generate_with, parse, Pkt};

/// Whether flows to `port` carry application data (the rest carry counter bytes).
fn carries_application_data(tcp: bool, port: u16) -> bool {
    if tcp {
        [80, 8080, 443, 993, 22, 25].contains(&port)
    } else {
        true
    }
}

/// Packets per canonical flow key, in trace order.
fn flows(cfg: &SynthConfig) -> BTreeMap<FlowKey, Vec<Pkt>> {
    let mut map: BTreeMap<FlowKey, Vec<Pkt>> = BTreeMap::new();
    let packets = generate(cfg);
    assert_eq!(packets.len() as u64, cfg.packets, "{cfg:?}");
    for (bytes, meta) in &packets {
        assert_eq!(meta.wire_len as usize, bytes.len());
        let p = parse(bytes);
        map.entry(p.key.canonical()).or_default().push(p);
    }
    assert_eq!(map.len() as u64, cfg.flows, "{cfg:?}");
    map
}

fn config(profile: Profile, flows: u64, packets: u64, seed: u64) -> SynthConfig {
    SynthConfig {
        flows,
        packets,
        seed,
        ..SynthConfig::new(profile)
    }
}

#[test]
fn exact_packets_and_flows_for_every_profile() {
    let cases: &[(Profile, u64, u64)] = &[
        (Profile::Long, 1, 7),
        (Profile::Long, 1, 2),
        (Profile::Long, 3, 30_000),
        (Profile::Long, 5, 10_001),
        (Profile::Short, 1, 2),
        (Profile::Short, 200, 400),
        (Profile::Short, 200, 1_399),
        (Profile::Short, 300, 20_000),
        (Profile::Mixed, 1, 13),
        (Profile::Mixed, 500, 1_000),
        (Profile::Mixed, 400, 18_765),
        (Profile::Uniform, 1, 1),
        (Profile::Uniform, 1, 1_000),
        (Profile::Uniform, 1_000, 1_000),
        (Profile::Uniform, 777, 5_000),
    ];
    for &(profile, n, m) in cases {
        for seed in [0, 1, 0xdead_beef] {
            let cfg = config(profile, n, m, seed);
            let map = flows(&cfg);
            let sizes: u64 = map.values().map(|v| v.len() as u64).sum();
            assert_eq!(sizes, m);
        }
    }
}

#[test]
fn zipf_skew_and_flow_counts_match_the_generator() {
    let mut cfg = config(Profile::Uniform, 1_000, 100_000, 3);
    cfg.zipf_s = 1.0;
    let synth = Synthetic::new(cfg.clone()).unwrap();
    let mut expected: Vec<u64> = (0..1_000).map(|i| synth.flow_packets(i).unwrap()).collect();
    assert_eq!(synth.flow_packets(1_000), None);
    let map = flows(&cfg);
    let mut got: Vec<u64> = map.values().map(|v| v.len() as u64).collect();
    got.sort_unstable();
    expected.sort_unstable();
    assert_eq!(got, expected);
    // Zipf s = 1 over 1000 ranks: the top flow has ~1/H(1000) = 13 % of the packets.
    let top = *got.last().unwrap();
    assert!((11_000..15_000).contains(&top), "top flow {top}");
    assert!(got[500] < 200, "median flow {}", got[500]);
}

#[test]
fn profile_shapes() {
    let s = Synthetic::new(config(Profile::Long, 20, 200_000, 1)).unwrap();
    for i in 0..20 {
        let c = s.flow_packets(i).unwrap();
        assert!((7_000..13_000).contains(&c), "long flow of {c}");
    }
    let s = Synthetic::new(config(Profile::Mixed, 5_000, 5_000 * 47, 1)).unwrap();
    let mut c: Vec<u64> = (0..5_000).map(|i| s.flow_packets(i).unwrap()).collect();
    c.sort_unstable();
    assert!(c[0] >= 7 && c[4_999] <= 1_200, "{} .. {}", c[0], c[4_999]);
    assert!(
        c[2_500] < 40,
        "heavy tail: median {} below mean 47",
        c[2_500]
    );
    assert!(c[4_950] > 400, "heavy tail: 99th percentile {}", c[4_950]);
}

/// Every TCP flow: handshake with options, exact sequence/acknowledgment numbers, timestamps
/// echoed, payload bytes that follow the sequence numbers, and the FIN/ACK teardown.
fn check_tcp_flow(flow: &[Pkt]) -> app::TcpCounts {
    let n = flow.len();
    assert!(n >= 7, "TCP flow of {n} packets");
    let client = flow[0].key;
    let side = |p: &Pkt| usize::from(p.key != client);
    for p in flow {
        assert!(p.key == client || p.key == client.reversed());
        assert_eq!(p.src_mac == CLIENT_MAC, side(p) == 0);
    }
    let t = |i: usize| flow[i].tcp.clone().unwrap();
    assert_eq!(t(0).flags, SYN);
    assert_eq!(side(&flow[0]), 0);
    assert_eq!(t(1).flags, SYN | ACK);
    assert_eq!(side(&flow[1]), 1);
    assert_eq!(t(2).flags, ACK);
    assert_eq!(side(&flow[2]), 0);
    for i in [0, 1] {
        assert_eq!(
            flow[i].option_kinds(),
            [2, 4, 8, 3],
            "MSS, SACK-perm, TS, WS"
        );
    }
    let tail: Vec<(usize, u8)> = (n - 4..n).map(|i| (side(&flow[i]), t(i).flags)).collect();
    assert_eq!(tail, [(0, FIN | ACK), (1, ACK), (1, FIN | ACK), (0, ACK)]);

    let mut nxt = [t(0).seq, t(1).seq];
    let mut last_ts = [0u32; 2];
    let mut data = [0usize; 2];
    let mut streams = [Vec::new(), Vec::new()];
    for (i, p) in flow.iter().enumerate() {
        let s = side(p);
        let tcp = p.tcp.as_ref().unwrap();
        assert_eq!(tcp.flags & RST, 0);
        assert_eq!(tcp.seq, nxt[s], "packet {i}: seq");
        if i > 0 {
            assert_ne!(tcp.flags & ACK, 0, "packet {i} acknowledges");
            assert_eq!(tcp.ack, nxt[1 - s], "packet {i}: ack");
        }
        let (val, ecr) = p.timestamps().expect("timestamps on every segment");
        assert!(
            val.wrapping_sub(last_ts[s]) < 1 << 31 || i < 2,
            "TSval moves forward"
        );
        if i > 0 {
            assert_eq!(ecr, last_ts[1 - s], "packet {i}: TSecr echoes the peer");
        }
        last_ts[s] = val;
        if !carries_application_data(true, flow[0].key.dst_port) {
            for (j, b) in p.payload.iter().enumerate() {
                assert_eq!(
                    *b,
                    tcp.seq.wrapping_add(j as u32) as u8,
                    "payload byte = seq mod 256"
                );
            }
        }
        streams[s].extend_from_slice(&p.payload);
        if !p.payload.is_empty() {
            assert_eq!(tcp.flags & (SYN | FIN), 0);
            data[s] += 1;
        }
        let advance = p.payload.len() as u32 + u32::from(tcp.flags & (SYN | FIN) != 0);
        nxt[s] = nxt[s].wrapping_add(advance);
    }
    if n >= 9 {
        assert!(data[0] >= 1 && data[1] >= 1, "data both ways: {data:?}");
    }
    app::check_tcp_streams(client.dst_port, &streams[0], &streams[1])
}

fn check_udp_flow(flow: &[Pkt]) -> usize {
    assert!(flow.len() >= 2);
    let client = flow[0].key;
    for (i, p) in flow.iter().enumerate() {
        let expect = if i % 2 == 0 {
            client
        } else {
            client.reversed()
        };
        assert_eq!(p.key, expect, "requests and responses alternate");
        assert!(!p.payload.is_empty());
    }
    let mut dns = 0;
    for pair in flow.chunks(2) {
        let answer = pair.get(1).map(|p| p.payload.as_slice());
        dns += app::check_udp_exchange(&client, &pair[0].payload, answer).dns_answers;
    }
    dns
}

#[test]
fn whole_tcp_and_udp_flows() {
    // Flows whose bytes were checked as counter bytes (MySQL and PostgreSQL ports).
    let mut counter = 0;
    for (profile, n, m) in [
        (Profile::Short, 300, 30_000),
        (Profile::Mixed, 300, 14_000),
        (Profile::Long, 3, 30_000),
        (Profile::Short, 100, 750),
    ] {
        for seed in [5, 6] {
            let mut cfg = config(profile, n, m, seed);
            cfg.ipv6_share = 0.3;
            cfg.tcp_share = 0.7;
            let map = flows(&cfg);
            let mut tcp = 0;
            let (mut http, mut tls, mut dns) = (0, 0, 0);
            for flow in map.values() {
                if flow[0].tcp.is_some() {
                    let c = check_tcp_flow(flow);
                    http += c.http_responses;
                    tls += c.client_hellos;
                    tcp += 1;
                    let port = flow[0].key.dst_port;
                    counter += usize::from(!carries_application_data(true, port));
                } else {
                    dns += check_udp_flow(flow);
                }
            }
            assert!(tcp > 0);
            // The application checks ran on real content.
            assert!(
                http > 0 && tls > 0,
                "{profile}: {http} HTTP responses, {tls} TLS"
            );
            assert!(
                dns > 0 || profile == Profile::Long,
                "{profile}: {dns} DNS answers"
            );
        }
    }
    assert!(counter > 0, "some flows carry counter bytes");
}

#[test]
fn short_budgets_turn_tcp_flows_into_udp() {
    // 10 flows, all TCP by share, but only 30 packets: 7 + 7 + 8 x 2 at most two stay TCP.
    let mut cfg = config(Profile::Short, 10, 30, 9);
    cfg.tcp_share = 1.0;
    let map = flows(&cfg);
    let tcp: Vec<_> = map.values().filter(|f| f[0].tcp.is_some()).collect();
    assert!(tcp.len() <= 2);
    for f in tcp {
        check_tcp_flow(f);
    }
    for f in map.values().filter(|f| f[0].tcp.is_none()) {
        check_udp_flow(f);
    }
}

#[test]
fn uniform_packets_have_the_fixed_size_and_any_direction() {
    let mut cfg = config(Profile::Uniform, 50, 2_000, 11);
    cfg.packet_size = SizeDist::Fixed(128);
    let packets = generate(&cfg);
    let mut forward = 0;
    for (bytes, _) in &packets {
        assert_eq!(bytes.len(), 128);
        let p = parse(bytes);
        assert_eq!(p.key.proto, 17);
        forward += usize::from(p.src_mac == CLIENT_MAC);
    }
    assert!(
        (800..1_200).contains(&forward),
        "{forward} of 2000 from clients"
    );

    // 64 bytes on the wire: 60 stored, IPv4 UDP with 18 payload bytes; TCP segments too.
    let mut cfg = config(Profile::Uniform, 100, 300, 12);
    cfg.tcp_share = 0.5;
    let map = flows(&cfg);
    for flow in map.values() {
        for p in flow {
            let hdr = if p.tcp.is_some() { 54 } else { 42 };
            assert_eq!(p.payload.len(), 60 - hdr);
            if let Some(t) = &p.tcp {
                assert_eq!(t.flags, PSH | ACK);
            }
        }
    }
}

#[test]
fn addresses_come_from_the_configured_subnets() {
    let mut cfg = config(Profile::Mixed, 400, 4_000, 13);
    cfg.ipv6_share = 0.5;
    cfg.clients_v4 = "172.16.0.0/12".parse().unwrap();
    cfg.servers_v4 = "192.0.2.0/28".parse().unwrap();
    cfg.clients_v6 = "fd12:3456::/32".parse().unwrap();
    cfg.servers_v6 = "2001:db8:1::/48".parse().unwrap();
    for flow in flows(&cfg).values() {
        let k = flow[0].key;
        match (k.src, k.dst) {
            (std::net::IpAddr::V4(c), std::net::IpAddr::V4(s)) => {
                assert_eq!(
                    u32::from(c) >> 20,
                    u32::from(std::net::Ipv4Addr::new(172, 16, 0, 0)) >> 20
                );
                assert_eq!(
                    u32::from(s) >> 4,
                    u32::from(std::net::Ipv4Addr::new(192, 0, 2, 0)) >> 4
                );
                let host = u32::from(s) & 0xf;
                assert!(host != 0 && host != 15);
            }
            (std::net::IpAddr::V6(c), std::net::IpAddr::V6(s)) => {
                assert_eq!(c.segments()[..2], [0xfd12, 0x3456]);
                assert_eq!(s.segments()[..3], [0x2001, 0xdb8, 1]);
            }
            _ => panic!("mixed families"),
        }
        assert!(
            k.src_port >= 32_768 && k.src_port <= 60_999,
            "ephemeral client port"
        );
    }
}

/// `clients_only`: exactly the clients' packets of the whole trace, byte for byte and with
/// their timestamps, for every flow profile and batch size; the progress counts the whole
/// trace; and the profiles it is not for refuse it.
#[test]
fn clients_only_is_the_whole_traces_client_packets() {
    use flowstate_io::Source;
    for profile in [
        Profile::Long,
        Profile::Short,
        Profile::Mixed,
        Profile::Uniform,
    ] {
        let mut cfg = SynthConfig::new(profile);
        cfg.flows = 300;
        cfg.packets = 20_000;
        cfg.seed = 5;
        cfg.ipv6_share = 0.3;
        let whole = generate(&cfg);
        let from_client = |f: &[u8]| {
            let d = flowstate_wire::dissect(f).unwrap();
            let src = d.flow.unwrap().src;
            match src {
                std::net::IpAddr::V4(a) => a.octets()[0] == 10,
                std::net::IpAddr::V6(a) => a.octets()[0] == 0xfd,
            }
        };
        let want: Vec<_> = whole.into_iter().filter(|(f, _)| from_client(f)).collect();
        assert!(want.len() > 1000, "{profile}");
        cfg.clients_only = true;
        for batch in [1, 7, 64] {
            assert_eq!(generate_with(&cfg, batch), want, "{profile}, batch {batch}");
        }
        let mut g = Synthetic::new(cfg.clone()).unwrap();
        let mut b = flowstate_io::PacketBatch::new(64, 2048);
        while g.recv(&mut b).unwrap() > 0 {}
        assert_eq!(Source::progress(&g), Some(20_000), "{profile}");
    }
    for profile in [Profile::Scan, Profile::Trojan] {
        let mut cfg = SynthConfig::new(profile);
        cfg.clients_only = true;
        assert!(
            matches!(
                cfg.validate(),
                Err(flowstate_io::Error::Option {
                    name: "clients_only",
                    ..
                })
            ),
            "{profile}"
        );
    }
}
