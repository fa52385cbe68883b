//! Generated traffic through the crate's own dissector: every packet parses, its flow key
//! matches, and its checksums verify.

mod synth_common;

use flowstate_io::synth::{Profile, SynthConfig};
use flowstate_wire::dissect::{verify_checksums, Network};
use flowstate_wire::{dissect, FlowKey};
use std::collections::BTreeSet;
use synth_common::{generate, parse};

#[test]
fn every_generated_packet_dissects_and_verifies() {
    for profile in Profile::ALL {
        let cfg = SynthConfig {
            flows: 300,
            packets: 12_000,
            seed: 21,
            ipv6_share: 0.4,
            tcp_share: 0.7,
            ..SynthConfig::new(profile)
        };
        let mut flows = BTreeSet::<FlowKey>::new();
        for (bytes, _) in generate(&cfg) {
            let d = dissect(&bytes).expect("generated frames dissect");
            let key = d.flow.expect("IP packets have a flow key");
            assert_eq!(key, parse(&bytes).key);
            let sums = verify_checksums(&bytes, &d);
            let v6 = d.network == Network::Ipv6;
            assert_eq!(sums.ip, if v6 { None } else { Some(true) });
            assert_eq!(sums.transport, Some(true));
            assert_eq!(d.payload_offset.map(|o| o <= d.l3_end), Some(true));
            flows.insert(key.canonical());
        }
        assert_eq!(flows.len(), 300, "{profile}");
    }
}
