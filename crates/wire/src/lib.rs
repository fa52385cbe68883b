//! Zero-copy packet views, checksums, flow keys, hashing, and memory hints for the tables
//! packets index.
//!
//! Promises:
//! * Every view is a `Packet<T: AsRef<[u8]>>` over caller-owned bytes. `new_checked` validates
//!   lengths once; afterwards no getter panics, whatever the bytes are. Setters need
//!   `T: AsMut<[u8]>` and keep checksums correct where they say so (RFC 1624 incremental update).
//! * Nothing in this crate allocates per packet or loops without a bound (the IPv6
//!   extension-header chain is bounded by [`ipv6::MAX_EXTENSION_HEADERS`]).
//! * [`hash::crc32c`] gives identical results with the SSE4.2 instruction and with the software
//!   table; [`hash::Toeplitz::symmetric`] hashes both directions of a flow alike.
//! * This crate depends on nothing else of flowstate's.

pub mod arp;
pub mod build;
pub mod checksum;
pub mod dissect;
pub mod ethernet;
pub mod flow;
pub mod geneve;
pub mod hash;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod mem;
pub mod tcp;
pub mod udp;

pub use dissect::{dissect, Dissection};
pub use flow::FlowKey;

use core::fmt;

/// The protocol layer a parse error was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// Ethernet II header, including 802.1Q/802.1ad tags.
    Ethernet,
    /// ARP.
    Arp,
    /// IPv4 header and options.
    Ipv4,
    /// IPv6 header and extension headers.
    Ipv6,
    /// TCP header and options.
    Tcp,
    /// UDP header.
    Udp,
    /// ICMPv4.
    Icmpv4,
    /// ICMPv6.
    Icmpv6,
    /// GENEVE encapsulation (RFC 8926).
    Geneve,
}

impl Layer {
    /// A short lower-case name (`"ipv4"`, `"tcp"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Layer::Ethernet => "ethernet",
            Layer::Arp => "arp",
            Layer::Ipv4 => "ipv4",
            Layer::Ipv6 => "ipv6",
            Layer::Tcp => "tcp",
            Layer::Udp => "udp",
            Layer::Icmpv4 => "icmpv4",
            Layer::Icmpv6 => "icmpv6",
            Layer::Geneve => "geneve",
        }
    }
}

/// Why a packet could not be parsed: the layer and a static reason. Cheap to create and copy
/// (no allocation), so the data path can count malformed packets by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Error {
    /// Where the problem was found.
    pub layer: Layer,
    /// What was wrong, e.g. `"truncated"` or `"header length below 20"`.
    pub reason: &'static str,
}

impl Error {
    /// An error at `layer` for `reason`.
    pub const fn new(layer: Layer, reason: &'static str) -> Self {
        Error { layer, reason }
    }

    /// The buffer ends before the header (or the length it declares) does.
    pub const fn truncated(layer: Layer) -> Self {
        Error::new(layer, "truncated")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.layer.name(), self.reason)
    }
}

impl std::error::Error for Error {}

/// Result of parsing with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;
