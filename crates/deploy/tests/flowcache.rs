//! The flow cache ([`flowstate_nf::stage::FlowCache`]) against its oracle, the chain itself: the
//! same traffic through firewall → NAT → LB with and without the cache leaves as the same
//! bytes, in the same order.

/// The runtime tests' helpers (sources, sinks, traces).
#[path = "../../chain/tests/common/mod.rs"]
mod common;

use common::*;
use flowstate_chain::RuntimeOptions;
use flowstate_chain::Summary;
use flowstate_deploy::Config;
use flowstate_io::synth::Profile;
use flowstate_io::PacketMeta;
use flowstate_nf::stage::FlowCacheOptions;
use std::path::Path;
use std::time::Duration;

/// The demo's chain (`examples/chain.toml`), one worker, and its options.
fn demo_chain() -> (Config, RuntimeOptions) {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/chain.toml"),
    )
    .unwrap();
    let mut config = Config::parse(&text, Path::new("examples/chain.toml")).unwrap();
    config.runtime.workers = 1;
    let options = config.runtime_options();
    (config, options)
}

fn run(t: &[(Vec<u8>, PacketMeta)], cache: Option<FlowCacheOptions>) -> (Summary, Vec<Vec<u8>>) {
    let (config, mut options) = demo_chain();
    options.flow_cache = cache;
    let rt = runtime(options, config.factories().unwrap());
    let mut sink = VecSink::default();
    let s = rt
        .run(&mut VecSource::new(t.to_vec()), Some(&mut sink))
        .unwrap();
    (s, sink.packets)
}

/// The demo's traffic: the clients' packets of a mixed trace to the demo's servers.
fn demo_trace(flows: u64, packets: u64, seed: u64) -> Vec<(Vec<u8>, PacketMeta)> {
    let (config, _) = demo_chain();
    let flowstate_deploy::config::Input::Synthetic(s) = &config.input else {
        panic!("the demo's input is synthetic");
    };
    let mut c = s.config.clone();
    (c.flows, c.packets, c.seed) = (flows, packets, seed);
    synthetic(c)
}

#[test]
fn the_chain_sends_the_same_bytes_with_a_flow_cache_as_without() {
    for (seed, refresh_ms) in [(1, 1000), (2, 5)] {
        let t = demo_trace(400, 40_000, seed);
        let (plain, want) = run(&t, None);
        let cache = FlowCacheOptions {
            capacity: 1 << 12,
            refresh: Duration::from_millis(refresh_ms),
        };
        let (cached, got) = run(&t, Some(cache));
        assert_eq!(plain.flow_cache, 0);
        assert_eq!(got.len(), want.len(), "seed {seed}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "seed {seed}: packet {i} of the output differs");
        }
        assert_eq!(cached.packets_out, plain.packets_out);
        assert_eq!(cached.reflected, plain.reflected);
        assert_eq!(cached.dropped, plain.dropped);
        // Most packets of established flows skip the NFs, which count the others only.
        let ran = cached.packets_out;
        assert!(
            cached.flow_cache * 3 > ran,
            "seed {seed}: {} of {ran} past the NFs",
            cached.flow_cache
        );
        for (p, c) in plain.nfs.iter().zip(&cached.nfs) {
            assert_eq!(c.packets_in + cached.flow_cache, p.packets_in, "{}", p.name);
        }
    }
}

#[test]
fn a_flow_cache_needs_every_nfs_consent() {
    let t = trace(Profile::Mixed, 20, 200, 3);
    let mut o = options(1);
    o.flow_cache = Some(FlowCacheOptions {
        capacity: 64,
        refresh: Duration::from_secs(1),
    });
    let chain = vec![flowstate_nf::registry::factory("counter", &toml::Table::new()).unwrap()];
    let e = runtime(o, chain)
        .run(&mut VecSource::new(t), None)
        .unwrap_err();
    assert!(e.to_string().contains("runtime.flow_cache"), "{e}");
}
