//! The reflect stage: plays the outside hosts, so that an offline run of a NAT or a stateful
//! firewall sees answers to what the inside sends.
//!
//! [`reflect`] builds the reply an outside host would send right away to a packet that left
//! the chain outbound: MAC addresses, IP addresses and ports swapped, checksums correct
//! (written by [`flowstate_wire::build`]), at the request's timestamp (zero round-trip time).
//!
//! | request | reply |
//! |---|---|
//! | TCP SYN | SYN+ACK: its own ISN (a hash of the flow), ack = seq + 1; MSS, window scale, SACK-permitted and timestamps offered back when the SYN offered them (RFC 9293 §3.5, RFC 7323) |
//! | TCP SYN+ACK (the inside is the server) | ACK of the SYN |
//! | TCP data | ACK of all of it, no payload: seq = the request's ack, ack = seq + length |
//! | TCP FIN (with or without data) | FIN+ACK acknowledging the data and the FIN |
//! | TCP RST, or a pure ACK | nothing |
//! | UDP | a datagram of the same size, payload echoed, ports swapped |
//! | ICMP / ICMPv6 echo request | echo reply with the same identifier, sequence number and data |
//! | anything else (fragments, other ICMP, other protocols, non-IP, two VLAN tags) | nothing |
//!
//! What it does not model: delay, loss and reordering; windows, retransmission and
//! congestion control; a host that never answers or answers with RST or ICMP unreachable;
//! the outside host's own state (every segment is answered on its own, so a FIN answering an
//! outside FIN is answered again); IPv4 options and IPv6 extension headers (replies carry
//! none). With a recorded trace, the inside's later segments acknowledge the recorded peer's
//! ISN, not the reflected SYN+ACK's, so an NF that checks sequence windows strictly sees a
//! mismatch there.

use flowstate_state::Nanos;
use flowstate_wire::build::{
    tcp_flags, EchoSpec, EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, Ipv6Spec, L4Spec, Payload,
    TcpOptions, TcpSpec, UdpSpec, ETHERNET_MIN_LEN,
};
use flowstate_wire::dissect::{dissect, Fragment, Network, Transport};
use flowstate_wire::hash::crc32c_flow;
use flowstate_wire::{ipv4, ipv6, tcp};

/// MSS the reflected side offers over IPv4 (Ethernet MTU 1500).
pub const MSS_V4: u16 = 1460;
/// MSS the reflected side offers over IPv6.
pub const MSS_V6: u16 = 1440;
/// Window scale shift the reflected side offers.
pub const WINDOW_SCALE: u8 = 7;
/// Receive window the reflected side advertises.
pub const WINDOW: u16 = 65_535;

/// Writes into `out` the reply an outside host sends to `request` (an Ethernet frame) at time
/// `now`, and returns its length; `None` when the request gets no reply (see the module
/// documentation), is malformed, or the reply does not fit `out`. Never panics.
pub fn reflect(request: &[u8], now: Nanos, out: &mut [u8]) -> Option<usize> {
    let d = dissect(request).ok()?;
    if d.fragment != Fragment::None || d.vlan_count > 1 {
        return None;
    }
    let flow = d.flow?;
    let mut ethernet = EthernetSpec::new(
        request.get(..6)?.try_into().ok()?,
        request.get(6..12)?.try_into().ok()?,
    );
    if d.vlan_count == 1 {
        ethernet.vlan = Some(u16::from_be_bytes(request.get(14..16)?.try_into().ok()?));
    }
    let l3 = request.get(d.l3_offset..d.l3_end)?;
    let ip = match d.network {
        Network::Ipv4 => {
            let h = ipv4::Packet::new_checked(l3).ok()?;
            let mut s = Ipv4Spec::new(h.dst_addr(), h.src_addr());
            s.tos = h.dscp() << 2 | h.ecn();
            IpSpec::V4(s)
        }
        Network::Ipv6 => {
            let h = ipv6::Packet::new_checked(l3).ok()?;
            let mut s = Ipv6Spec::new(h.dst_addr(), h.src_addr());
            s.traffic_class = h.traffic_class();
            IpSpec::V6(s)
        }
        _ => return None,
    };
    let v6 = matches!(ip, IpSpec::V6(_));
    let l4 = request.get(d.l4_offset?..d.l3_end)?;
    let payload = request.get(d.payload_offset?..d.l3_end)?;
    let (l4, payload) = match d.transport {
        Transport::Tcp => {
            let t = tcp::Packet::new_checked(l4).ok()?;
            (
                tcp_reply(&t, now, v6, || crc32c_flow(&flow))?,
                Payload::EMPTY,
            )
        }
        Transport::Udp => (
            L4Spec::Udp(UdpSpec {
                src_port: flow.dst_port,
                dst_port: flow.src_port,
            }),
            Payload::Bytes(payload),
        ),
        Transport::Icmpv4 { kind: 8, code: 0 } | Transport::Icmpv6 { kind: 128, code: 0 } => {
            let h = l4.get(4..8)?;
            (
                L4Spec::Echo(EchoSpec {
                    reply: true,
                    id: u16::from_be_bytes([h[0], h[1]]),
                    seq: u16::from_be_bytes([h[2], h[3]]),
                }),
                Payload::Bytes(payload),
            )
        }
        _ => return None,
    };
    let spec = FrameSpec {
        ethernet,
        ip,
        l4,
        payload,
        min_len: ETHERNET_MIN_LEN,
    };
    if spec.frame_len() > out.len() {
        return None;
    }
    spec.write(out).ok()
}

/// The TCP header answering `t`; `isn` gives the reflected side's initial sequence number
/// (drawn only for the segments that need it: a SYN's answer, or an answer to no ACK).
fn tcp_reply<T: AsRef<[u8]>>(
    t: &tcp::Packet<T>,
    now: Nanos,
    v6: bool,
    isn: impl FnOnce() -> u32,
) -> Option<L4Spec> {
    if t.rst() {
        return None;
    }
    let (syn, fin, ack) = (t.syn(), t.fin(), t.ack());
    let seg_len = t.payload().len() as u32 + u32::from(syn) + u32::from(fin);
    if seg_len == 0 {
        // A pure ACK (or a window probe of zero bytes): nothing to answer.
        return None;
    }
    // RFC 7323 §3.2: TSecr echoes the TSval of the segment being acknowledged; the reflected
    // host's own clock ticks in milliseconds of runtime time.
    let ts_now = (now / 1_000_000) as u32;
    let timestamps = t.timestamps().map(|(val, _)| (ts_now, val));
    let ack_no = t.seq_number().wrapping_add(seg_len);
    let spec = if syn && !ack {
        TcpSpec {
            src_port: t.dst_port(),
            dst_port: t.src_port(),
            seq: isn(),
            ack: ack_no,
            flags: tcp_flags::SYN | tcp_flags::ACK,
            window: WINDOW,
            urgent: 0,
            options: TcpOptions {
                mss: t.mss().map(|_| if v6 { MSS_V6 } else { MSS_V4 }),
                window_scale: t.window_scale().map(|_| WINDOW_SCALE),
                sack_permitted: t.sack_permitted(),
                timestamps,
            },
        }
    } else {
        TcpSpec {
            src_port: t.dst_port(),
            dst_port: t.src_port(),
            // What the inside expects next from us; without ACK it told us nothing.
            seq: if ack { t.ack_number() } else { isn() },
            ack: ack_no,
            flags: tcp_flags::ACK | if fin { tcp_flags::FIN } else { 0 },
            window: WINDOW,
            urgent: 0,
            options: TcpOptions {
                timestamps,
                ..TcpOptions::NONE
            },
        }
    };
    Some(L4Spec::Tcp(spec))
}
