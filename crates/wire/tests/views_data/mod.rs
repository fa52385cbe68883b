//! Byte fixtures shared by the `views_*` tests: Ethernet frames built by `gen_fixtures.py`
//! (beside this file, with its own RFC 1071 implementation) and cross-checked with tshark:
//! every checksum below is the value tshark reported as correct, every field as tshark decoded
//! it. The script's docstring says how to regenerate and re-check them.
#![allow(dead_code)]

/// Decodes a hex string (whitespace ignored).
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// TCP SYN 10.0.0.1:54321 -> 10.0.0.2:80 with Linux's option layout: MSS 1460, SACK permitted,
/// timestamps (TSval 0x0a1b2c3d, TSecr 0), NOP, window scale 7. IP checksum 0xaa9b, TCP 0x8aa3.
pub(crate) const TCP_SYN: &str = "\
    525400abcdef52540012345608004500003c7c1e40004006aa9b0a0000010a000002d43100503ade68b10000\
    0000a002faf08aa30000020405b40402080a0a1b2c3d0000000001030307";

/// UDP DNS query (id 0xbeef, A example.com) 192.168.1.100:53000 -> 192.168.1.1:53.
/// IP checksum 0x69d0, UDP 0x1e53.
pub(crate) const UDP_DNS: &str = "\
    525400abcdef5254001234560800450000394d2e4000401169d0c0a80164c0a80101cf08003500251e53beef\
    01000001000000000000076578616d706c6503636f6d0000010001";

/// ICMP echo request 192.168.1.100 -> 8.8.8.8, id 0x1234, seq 1, 48 bytes of ping data.
/// IP checksum 0xbcc7, ICMP 0xc026.
pub(crate) const ICMP_ECHO: &str = "\
    525400abcdef52540012345608004500004cabcd40004001bcc7c0a80164080808080800c0261234000165a1\
    b2c3000d4e5f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435\
    3637";

/// ICMP port unreachable 192.168.1.1 -> 192.168.1.100 (TOS 0xc0, no DF) carrying the whole
/// `UDP_DNS` IP packet. IP checksum 0xe813, ICMP 0x80e9.
pub(crate) const ICMP_UNREACH: &str = "\
    525400123456525400abcdef080045c000550e1f00004001e813c0a80101c0a80164030380e9000000004500\
    00394d2e4000401169d0c0a80164c0a80101cf08003500251e53beef01000001000000000000076578616d70\
    6c6503636f6d0000010001";

/// IPv6 2001:db8::1 -> 2001:db8::2 (flow label 0x12345): Hop-by-Hop (Router Alert, PadN),
/// Destination Options (16 bytes, PadN), TCP 40000 -> 80 PSH|ACK with an 18-byte HTTP request.
/// TCP checksum 0xcb66.
pub(crate) const IPV6_EXT_TCP: &str = "\
    525400abcdef52540012345686dd60012345003e004020010db800000000000000000000000120010db80000\
    000000000000000000023c000502000001000601010c0000000000000000000000009c400050000003e80000\
    07d0501801f6cb660000474554202f20485454502f312e310d0a0d0a";

/// First IPv6 fragment (offset 0, M, ident 0xcafe0001) of a 108-byte UDP datagram
/// 5353 -> 9999: the UDP header and 48 bytes. UDP checksum 0x5236 (of the whole datagram).
pub(crate) const IPV6_FRAG_FIRST: &str = "\
    525400abcdef52540012345686dd6000000000402c4020010db800000000000000000000000120010db80000\
    0000000000000000000211000001cafe000114e9270f006c523600070e151c232a31383f464d545b62697077\
    7e858c939aa1a8afb6bdc4cbd2d9e0e7eef5fc030a11181f262d343b4249";

/// The second and last fragment (offset 56) of the same datagram.
pub(crate) const IPV6_FRAG_LATER: &str = "\
    525400abcdef52540012345686dd60000000003c2c4020010db800000000000000000000000120010db80000\
    0000000000000000000211000038cafe000150575e656c737a81888f969da4abb2b9c0c7ced5dce3eaf1f8ff\
    060d141b222930373e454c535a61686f767d848b9299a0a7aeb5";

/// QinQ: 802.1ad tag (PCP 3, VID 100), 802.1Q tag (VID 200), IPv4 UDP 10.1.1.1:5000 ->
/// 10.2.2.2:6000 with 2 bytes of data, padded to 64 bytes. IP checksum 0x23c9, UDP 0x5573.
pub(crate) const QINQ_UDP: &str = "\
    525400abcdef52540012345688a86064810000c808004500001e00014000401123c90a0101010a0202021388\
    1770000a55736869000000000000000000000000";

/// ARP request: who has 192.168.1.1? tell 192.168.1.100 (52:54:00:12:34:56), padded to 60.
pub(crate) const ARP_REQUEST: &str = "\
    ffffffffffff52540012345608060001080006040001525400123456c0a80164000000000000c0a801010000\
    00000000000000000000000000000000";

/// IGMPv2 membership report for 239.1.2.3 with the IPv4 Router Alert option (IHL 6,
/// TTL 1), padded to 60 bytes. IP checksum 0x3107, IGMP 0xf8fa.
pub(crate) const IPV4_OPTIONS_IGMP: &str = "\
    01005e010203525400123456080046c000200000400001023107c0a80164ef010203940400001600f8faef01\
    02030000000000000000000000000000";

/// A bare TCP ACK 10.0.0.2:80 -> 10.0.0.1:54321 (54 bytes) padded to the 60-byte minimum.
/// IP checksum 0x26ce, TCP 0xdd5c.
pub(crate) const TCP_ACK_PADDED: &str = "\
    525400123456525400abcdef08004500002800004000400626ce0a0000020a0000010050d431112233443ade\
    68b2501001fddd5c0000000000000000";

/// ICMPv6 echo request 2001:db8::1 -> 2001:db8::2, id 0x0777, seq 3, data "abcdefgh".
/// ICMPv6 checksum 0x8b30.
pub(crate) const ICMPV6_ECHO: &str = "\
    525400abcdef52540012345686dd6000000000103a4020010db800000000000000000000000120010db80000\
    0000000000000000000280008b30077700036162636465666768";

/// First IPv4 fragment (MF, offset 0, id 0x5555) of a 208-byte UDP datagram 40001 -> 40002:
/// the UDP header and 96 bytes. IP checksum 0xf119, UDP 0xde90 (of the whole datagram).
pub(crate) const IPV4_FRAG_FIRST: &str = "\
    525400abcdef52540012345608004500007c555520004011f1190a0000010a0000029c419c4200d0de900001\
    02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d\
    2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f50515253545556575859\
    5a5b5c5d5e5f";

/// The last fragment (offset 104) of the same datagram. IP checksum 0x110d.
pub(crate) const IPV4_FRAG_LATER: &str = "\
    525400abcdef52540012345608004500007c5555000d4011110d0a0000010a00000260616263646566676869\
    6a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495\
    969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1\
    c2c3c4c5c6c7";

/// Every fixture with its name.
pub(crate) const ALL: &[(&str, &str)] = &[
    ("tcp_syn", TCP_SYN),
    ("udp_dns", UDP_DNS),
    ("icmp_echo", ICMP_ECHO),
    ("icmp_unreach", ICMP_UNREACH),
    ("ipv6_ext_tcp", IPV6_EXT_TCP),
    ("ipv6_frag_first", IPV6_FRAG_FIRST),
    ("ipv6_frag_later", IPV6_FRAG_LATER),
    ("qinq_udp", QINQ_UDP),
    ("arp_request", ARP_REQUEST),
    ("ipv4_options_igmp", IPV4_OPTIONS_IGMP),
    ("tcp_ack_padded", TCP_ACK_PADDED),
    ("icmpv6_echo", ICMPV6_ECHO),
    ("ipv4_frag_first", IPV4_FRAG_FIRST),
    ("ipv4_frag_later", IPV4_FRAG_LATER),
];
