//! The data path's prefix: an address and a length, matched by mask.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 prefix, `addr/len`: the data path's form of the configuration's
/// [`crate::IpNet`] (a mask match).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

/// Why a prefix does not parse (what [`crate::parse_prefix`] says).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PrefixError(pub String);

impl IpPrefix {
    /// `addr/len`, `len` clamped to the address family's width; host bits are cleared.
    pub fn new(addr: IpAddr, len: u8) -> Self {
        let len = len.min(if addr.is_ipv4() { 32 } else { 128 });
        let addr = match addr {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask32(len)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask128(len)).into()),
        };
        IpPrefix { addr, len }
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// Whether this is the zero-length prefix (every address of its family).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `ip` is in the prefix (an address of the other family never is).
    #[inline]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => u32::from(a) & mask32(self.len) == u32::from(n),
            (IpAddr::V6(n), IpAddr::V6(a)) => u128::from(a) & mask128(self.len) == u128::from(n),
            _ => false,
        }
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(len.min(32)))
        .unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(len.min(128)))
        .unwrap_or(0)
}

impl FromStr for IpPrefix {
    type Err = PrefixError;

    /// `10.0.0.0/8`, `fd00::/8`, or a bare address (a host prefix); host bits set are an
    /// error ([`crate::parse_prefix`]).
    fn from_str(s: &str) -> Result<Self, PrefixError> {
        crate::parse_prefix(s)
            .map(IpPrefix::from)
            .map_err(PrefixError)
    }
}

impl From<crate::IpNet> for IpPrefix {
    fn from(n: crate::IpNet) -> Self {
        IpPrefix::new(n.network(), n.prefix_len())
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
