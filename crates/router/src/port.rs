//! A port's configuration (`[input]`/`[output] interface = ...` of a live box or a root).

use std::time::Duration;

/// One port of a live box (`[input] interface = ...`, `[output] interface = ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePort {
    /// The network interface.
    pub interface: String,
    /// The box's IPv4 address on it (answered in ARP).
    pub address: std::net::Ipv4Addr,
    /// Next hop of every packet leaving by this port (`None`: destinations are on the link).
    pub gateway: Option<std::net::Ipv4Addr>,
    /// The box's IPv6 address on it (answered in neighbour discovery; `None`: the port
    /// routes no IPv6).
    pub address6: Option<std::net::Ipv6Addr>,
    /// Next hop of every IPv6 packet leaving by this port (`None`: on the link).
    pub gateway6: Option<std::net::Ipv6Addr>,
    /// How packets are read and written (`[input] driver`; the same for both ports).
    pub driver: Driver,
    /// The XDP fast path in front of the chain (`None`: every packet takes the chain).
    pub fast_path: Option<FastPathConfig>,
}

/// `[input] fast_path`, `fast_path_refresh`, `fast_path_capacity`: the XDP fast path of a live
/// box, with either driver (`flowstate_fastpath::flowcache`). It is used when every NF of the chain
/// allows it and the box runs one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastPathConfig {
    /// How long an entry lives past the slow path's last packet of its flow (default 1 s;
    /// keep it below the NFs' shortest idle timeout).
    pub refresh: Duration,
    /// Flow directions the table holds (default 65,536; least recently used go first).
    pub capacity: u32,
    /// `fast_path = true` was given: a kernel that refuses the fast path is an error (by
    /// default the box runs without it, with a warning).
    pub required: bool,
}

/// `[input] driver`: the I/O behind a live box's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Driver {
    /// AF_PACKET sockets, TPACKET_V2 receive ring (default).
    #[default]
    AfPacket,
    /// AF_XDP sockets (generic mode) for receiving, AF_PACKET for sending.
    AfXdp,
}
