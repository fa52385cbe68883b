//! Determinism, streaming behaviour, timestamps, shares and interleaving.

mod synth_common;

use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, Source};
use flowstate_wire::FlowKey;
use std::collections::BTreeMap;
use synth_common::{generate, generate_with, parse};

fn config(profile: Profile, flows: u64, packets: u64, seed: u64) -> SynthConfig {
    SynthConfig {
        flows,
        packets,
        seed,
        ..SynthConfig::new(profile)
    }
}

/// FNV-1a over every packet and its metadata: a fingerprint of a whole trace.
fn fingerprint(cfg: &SynthConfig) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (bytes, meta) in generate(cfg) {
        eat(&bytes);
        eat(&meta.timestamp_ns.to_le_bytes());
        eat(&meta.wire_len.to_le_bytes());
    }
    h
}

#[test]
fn same_seed_same_bytes_different_seed_different_bytes() {
    for profile in [
        Profile::Long,
        Profile::Short,
        Profile::Mixed,
        Profile::Uniform,
    ] {
        let cfg = config(profile, 50, 5_000, 42);
        assert_eq!(generate(&cfg), generate(&cfg), "{profile}");
        let other = config(profile, 50, 5_000, 43);
        assert_ne!(fingerprint(&cfg), fingerprint(&other), "{profile}");
    }
}

/// Pinned fingerprints: a change here means traces for a given seed changed, which breaks
/// every recorded experiment. Change only deliberately.
#[test]
fn traces_are_stable_across_versions_and_platforms() {
    let mut mixed = config(Profile::Mixed, 100, 5_000, 7);
    mixed.zipf_s = 0.8;
    let got = [
        fingerprint(&config(Profile::Long, 3, 3_000, 1)),
        fingerprint(&config(Profile::Short, 40, 4_000, 2)),
        fingerprint(&mixed),
        fingerprint(&config(Profile::Uniform, 300, 1_000, 3)),
    ];
    assert_eq!(got, PINNED, "got {got:#x?}");
}

/// Changed deliberately for application payloads (issue #17): `long`, `short` and `mixed`
/// carry protocol data on well-known ports and draw TCP segment lengths from a stream of
/// their own; `uniform` is unchanged.
const PINNED: [u64; 4] = [
    0x5f3b_af21_a01c_deac,
    0x5323_36a9_4434_0a71,
    0x42d0_16e7_be8f_835b,
    0x94a9_beed_d3df_ca55,
];

#[test]
fn batch_size_does_not_change_the_trace() {
    let cfg = config(Profile::Mixed, 80, 3_000, 9);
    let a = generate_with(&cfg, 1);
    assert_eq!(a, generate_with(&cfg, 7));
    assert_eq!(a, generate_with(&cfg, 256));
}

#[test]
fn short_buffers_keep_a_prefix_and_the_wire_length() {
    let cfg = config(Profile::Short, 20, 2_000, 4);
    let full = generate(&cfg);
    let mut synth = Synthetic::new(cfg).unwrap();
    let mut batch = PacketBatch::new(16, 100);
    let mut i = 0;
    while synth.recv(&mut batch).unwrap() > 0 {
        for (bytes, meta) in batch.iter() {
            let (whole, whole_meta) = &full[i];
            assert_eq!(meta.wire_len, whole_meta.wire_len);
            assert_eq!(meta.timestamp_ns, whole_meta.timestamp_ns);
            assert_eq!(bytes, &whole[..whole.len().min(100)]);
            i += 1;
        }
    }
    assert_eq!(i, full.len());
}

#[test]
fn timestamps_follow_the_rate() {
    let mut cfg = config(Profile::Short, 10, 1_000, 5);
    cfg.rate_pps = 250_000.0;
    cfg.start_ns = 1_700_000_000_000_000_000;
    for (i, (_, meta)) in generate(&cfg).iter().enumerate() {
        assert_eq!(meta.timestamp_ns, cfg.start_ns + 4_000 * i as u64);
        assert_eq!(meta.port, 0);
    }
}

#[test]
fn ipv6_share_is_roughly_respected() {
    for share in [0.0, 0.25, 1.0] {
        let mut cfg = config(Profile::Mixed, 4_000, 8_000, 6);
        cfg.ipv6_share = share;
        let mut families: BTreeMap<FlowKey, bool> = BTreeMap::new();
        for (bytes, _) in generate(&cfg) {
            let p = parse(&bytes);
            families.insert(p.key.canonical(), p.v6());
        }
        assert_eq!(families.len(), 4_000);
        let v6 = families.values().filter(|&&v| v).count() as f64 / 4_000.0;
        assert!((v6 - share).abs() < 0.03, "share {share}: got {v6}");
    }
}

#[test]
fn tcp_share_is_roughly_respected() {
    let mut cfg = config(Profile::Mixed, 2_000, 200_000, 8);
    cfg.tcp_share = 0.6;
    let mut tcp: BTreeMap<FlowKey, bool> = BTreeMap::new();
    for (bytes, _) in generate(&cfg) {
        let p = parse(&bytes);
        tcp.insert(p.key.canonical(), p.tcp.is_some());
    }
    let share = tcp.values().filter(|&&t| t).count() as f64 / 2_000.0;
    assert!((share - 0.6).abs() < 0.04, "{share}");
}

/// Flows interleave, and about `concurrency` of them are active at once in the middle.
#[test]
fn flows_interleave_with_the_configured_concurrency() {
    let mut cfg = config(Profile::Short, 2_000, 200_000, 10);
    cfg.concurrency = 100;
    let packets = generate(&cfg);
    let mut span: BTreeMap<FlowKey, (usize, usize)> = BTreeMap::new();
    for (i, (bytes, _)) in packets.iter().enumerate() {
        let k = parse(bytes).key.canonical();
        span.entry(k).and_modify(|s| s.1 = i).or_insert((i, i));
    }
    assert_eq!(span.len(), 2_000);
    for at in [50_000, 100_000, 150_000] {
        let active = span.values().filter(|(a, b)| *a <= at && at <= *b).count();
        assert!(
            (60..=160).contains(&active),
            "{active} active at packet {at}"
        );
    }
    // Flows start in order over the whole trace, not all at once.
    let mut starts: Vec<usize> = span.values().map(|s| s.0).collect();
    starts.sort_unstable();
    assert!(
        starts[1_000] > 60_000 && starts[1_000] < 140_000,
        "{}",
        starts[1_000]
    );

    // Concurrency 0 (the `long` default): every flow is active in the middle.
    let cfg = config(Profile::Long, 30, 30_000, 11);
    let packets = generate(&cfg);
    let mut seen: BTreeMap<FlowKey, usize> = BTreeMap::new();
    for (bytes, _) in &packets[14_000..16_000] {
        *seen.entry(parse(bytes).key.canonical()).or_default() += 1;
    }
    assert_eq!(seen.len(), 30);
}

#[test]
fn progress_and_total() {
    let cfg = config(Profile::Uniform, 10, 100, 12);
    let mut synth = Synthetic::new(cfg).unwrap();
    assert_eq!(synth.total_packets(), 100);
    assert_eq!(synth.progress(), 0);
    let mut batch = PacketBatch::new(32, 2048);
    assert_eq!(synth.recv(&mut batch).unwrap(), 32);
    assert_eq!(synth.progress(), 32);
    while synth.recv(&mut batch).unwrap() > 0 {}
    assert_eq!(synth.progress(), 100);
    assert_eq!(synth.config().flows, 10);
}
