//! Property test: frames written by `build` dissect back to what was built.

use flowstate_wire::build::*;
use flowstate_wire::dissect::{verify_checksums, Fragment, Network, Transport};
use flowstate_wire::{dissect, flow::proto};
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn ip_strategy() -> impl Strategy<Value = IpSpec> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u16>(),
            any::<bool>()
        )
            .prop_map(|(s, d, ttl, id, df)| IpSpec::V4(Ipv4Spec {
                ttl,
                id,
                dont_fragment: df,
                ..Ipv4Spec::new(Ipv4Addr::from(s), Ipv4Addr::from(d))
            })),
        (any::<u128>(), any::<u128>(), any::<u8>(), any::<u32>()).prop_map(|(s, d, hl, fl)| {
            IpSpec::V6(Ipv6Spec {
                hop_limit: hl,
                flow_label: fl,
                ..Ipv6Spec::new(Ipv6Addr::from(s), Ipv6Addr::from(d))
            })
        }),
    ]
}

fn options_strategy() -> impl Strategy<Value = TcpOptions> {
    (
        proptest::option::of(any::<u16>()),
        proptest::option::of(0u8..15),
        any::<bool>(),
        proptest::option::of(any::<(u32, u32)>()),
    )
        .prop_map(
            |(mss, window_scale, sack_permitted, timestamps)| TcpOptions {
                mss,
                window_scale,
                sack_permitted,
                timestamps,
            },
        )
}

fn l4_strategy() -> impl Strategy<Value = L4Spec> {
    prop_oneof![
        (
            any::<(u16, u16, u32, u32)>(),
            any::<u8>(),
            any::<u16>(),
            options_strategy()
        )
            .prop_map(|((sp, dp, seq, ack), flags, window, options)| {
                L4Spec::Tcp(TcpSpec {
                    src_port: sp,
                    dst_port: dp,
                    seq,
                    ack,
                    flags,
                    window,
                    urgent: 0,
                    options,
                })
            }),
        any::<(u16, u16)>().prop_map(|(sp, dp)| L4Spec::Udp(UdpSpec {
            src_port: sp,
            dst_port: dp
        })),
        any::<(bool, u16, u16)>().prop_map(|(reply, id, seq)| L4Spec::Echo(EchoSpec {
            reply,
            id,
            seq
        })),
    ]
}

proptest! {
    #[test]
    fn build_then_dissect(
        ip in ip_strategy(),
        l4 in l4_strategy(),
        vlan in proptest::option::of(0u16..4096),
        payload_len in 0usize..1500,
        start in any::<u8>(),
        pad in any::<bool>(),
    ) {
        let spec = FrameSpec {
            ethernet: EthernetSpec { vlan, ..EthernetSpec::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]) },
            ip,
            l4,
            payload: Payload::Counter { len: payload_len, start },
            min_len: if pad { ETHERNET_MIN_LEN } else { 0 },
        };
        let mut buf = [0u8; 1600];
        let n = spec.write(&mut buf).unwrap();
        prop_assert_eq!(n, spec.frame_len());
        let d = dissect(&buf[..n]).unwrap();

        let l3 = spec.ethernet.header_len();
        let l4_at = l3 + spec.ip.header_len();
        let v6 = matches!(spec.ip, IpSpec::V6(_));
        prop_assert_eq!(d.vlan_count, u8::from(vlan.is_some()));
        if let Some(id) = vlan {
            prop_assert_eq!(d.vlan_ids[0], id);
        }
        prop_assert_eq!(d.l3_offset, l3);
        prop_assert_eq!(d.network, if v6 { Network::Ipv6 } else { Network::Ipv4 });
        prop_assert_eq!(d.ethertype, if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 });
        prop_assert_eq!(d.fragment, Fragment::None);
        prop_assert_eq!(d.l4_offset, Some(l4_at));
        prop_assert_eq!(d.payload_offset, Some(l4_at + spec.l4.header_len()));
        prop_assert_eq!(d.l3_end, spec.header_len() + payload_len);
        prop_assert_eq!(d.flow, Some(spec.flow_key()));
        let (protocol, transport) = match spec.l4 {
            L4Spec::Tcp(_) => (proto::TCP, Transport::Tcp),
            L4Spec::Udp(_) => (proto::UDP, Transport::Udp),
            L4Spec::Echo(e) if v6 => (proto::ICMPV6, Transport::Icmpv6 { kind: e.icmp_type(true), code: 0 }),
            L4Spec::Echo(e) => (proto::ICMP, Transport::Icmpv4 { kind: e.icmp_type(false), code: 0 }),
        };
        prop_assert_eq!(d.protocol, protocol);
        prop_assert_eq!(d.transport, transport);
        let sums = verify_checksums(&buf[..n], &d);
        prop_assert_eq!(sums.ip, if v6 { None } else { Some(true) });
        prop_assert_eq!(sums.transport, Some(true));
    }
}
