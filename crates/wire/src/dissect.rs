//! One-pass dissection of an Ethernet frame down to the transport header.
//!
//! [`dissect`] walks Ethernet (with up to two 802.1Q/802.1ad tags), ARP, IPv4 (options,
//! fragments), IPv6 (a bounded chain of extension headers) and the transport header, and
//! returns where each layer starts and the packet's [`FlowKey`]. It never allocates or panics;
//! a malformed packet is an [`Error`](crate::Error) naming the layer and the reason.

use crate::{FlowKey, Result};

/// The network layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// IPv4 at `l3_offset`.
    Ipv4,
    /// IPv6 at `l3_offset`.
    Ipv6,
    /// ARP at `l3_offset`.
    Arp,
    /// Another EtherType, not parsed further.
    Other(u16),
}

/// Where an IPv4 packet or IPv6 fragment header places this packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// Not fragmented.
    None,
    /// First fragment (offset 0, more fragments follow): carries the transport header.
    First,
    /// A later fragment: no transport header, ports unknown.
    Later,
}

/// The transport layer of an IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// No transport header: not IP, or a later fragment.
    None,
    /// TCP at `l4_offset`.
    Tcp,
    /// UDP at `l4_offset`.
    Udp,
    /// ICMPv4 at `l4_offset` with its type and code.
    Icmpv4 {
        /// ICMP type.
        kind: u8,
        /// ICMP code.
        code: u8,
    },
    /// ICMPv6 at `l4_offset` with its type and code.
    Icmpv6 {
        /// ICMPv6 type.
        kind: u8,
        /// ICMPv6 code.
        code: u8,
    },
    /// Another IP protocol (`protocol` tells which), not parsed.
    Other,
}

/// What [`dissect`] found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dissection {
    /// Number of VLAN tags (0, 1 or 2).
    pub vlan_count: u8,
    /// VLAN ids, outermost first; only the first `vlan_count` are meaningful.
    pub vlan_ids: [u16; 2],
    /// EtherType after any tags.
    pub ethertype: u16,
    /// Offset of the network header.
    pub l3_offset: usize,
    /// The network layer.
    pub network: Network,
    /// IP protocol number of the transport (after IPv6 extension headers); 0 when not IP.
    pub protocol: u8,
    /// Fragment position (IPv4 flags/offset, or the IPv6 fragment header).
    pub fragment: Fragment,
    /// Offset of the transport header, when the packet carries one.
    pub l4_offset: Option<usize>,
    /// The transport layer.
    pub transport: Transport,
    /// Offset of the transport payload, when the packet carries a TCP/UDP/ICMP header.
    pub payload_offset: Option<usize>,
    /// The IP packet's end within the frame (Ethernet padding excluded).
    pub l3_end: usize,
    /// The flow key, for IP packets.
    pub flow: Option<FlowKey>,
}

/// Dissects an Ethernet II frame.
pub fn dissect(frame: &[u8]) -> Result<Dissection> {
    let _ = frame;
    todo!("issue 2: helper fills this in")
}
