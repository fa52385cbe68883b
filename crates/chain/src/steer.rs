//! Which way a packet goes and which worker takes it.
//!
//! * Direction: a packet whose source address is in one of the `inside` prefixes is
//!   [`Direction::Outbound`]; every other packet (non-IP ones included) is
//!   [`Direction::Inbound`].
//! * Worker: `toeplitz_symmetric(flow) % workers` (the NIC RSS hash with a symmetric key), so
//!   both directions of a flow reach one worker. IPv4 fragments hash as their flow: the
//!   first fragment has the ports, and the fragment tracker ([`crate::fragments`]) gives them
//!   to the later ones ([`Fragment::Tracked`]). Fragments without ports (IPv6 fragments, an
//!   untracked later fragment) hash on their addresses and protocol only (ports zeroed), as
//!   RSS does, so every fragment of a packet reaches the same worker. ICMP errors hash on
//!   the flow they quote, so they reach the worker of that flow.
//!   Non-IP packets go to worker 0.
//! * Ownership first: when the chain holds state that one worker owns (a NAT's external
//!   ports, an LB's connections), [`crate::owners::Owners`] sends the packet to that worker.

use flowstate_nf::Direction;
use flowstate_wire::dissect::{Fragment, Network, Transport};
use flowstate_wire::hash::Toeplitz;
use flowstate_wire::{icmp, Dissection, FlowKey};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 prefix, `addr/len`: the data path's form of the configuration's
/// [`flowstate_config::IpNet`] (a mask match).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

/// Why a prefix does not parse (what [`flowstate_config::parse_prefix`] says).
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
    /// error ([`flowstate_config::parse_prefix`]).
    fn from_str(s: &str) -> Result<Self, PrefixError> {
        flowstate_config::parse_prefix(s)
            .map(IpPrefix::from)
            .map_err(PrefixError)
    }
}

impl From<flowstate_config::IpNet> for IpPrefix {
    fn from(n: flowstate_config::IpNet) -> Self {
        IpPrefix::new(n.network(), n.prefix_len())
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Classifies packets by direction and steers them to workers.
#[derive(Debug, Clone)]
pub struct Steering {
    inside: Vec<IpPrefix>,
    workers: u32,
    toeplitz: Toeplitz,
    owners: crate::owners::Owners,
}

impl Steering {
    /// Steering over `workers` workers (at least 1) with these inside prefixes.
    pub fn new(inside: Vec<IpPrefix>, workers: usize) -> Self {
        Steering {
            inside,
            workers: u32::try_from(workers.max(1)).unwrap_or(u32::MAX),
            toeplitz: Toeplitz::symmetric(),
            owners: crate::owners::Owners::default(),
        }
    }

    /// The same, steering by state ownership first.
    pub fn with_owners(mut self, owners: crate::owners::Owners) -> Self {
        self.owners = owners;
        self
    }

    /// The inside prefixes.
    pub fn inside(&self) -> &[IpPrefix] {
        &self.inside
    }

    /// The packet's direction.
    #[inline]
    pub fn direction(&self, d: &Dissection) -> Direction {
        match d.flow {
            Some(f) if self.inside.iter().any(|p| p.contains(f.src)) => Direction::Outbound,
            _ => Direction::Inbound,
        }
    }

    /// The worker of a flow key (a flow and its reverse give the same worker).
    #[inline]
    pub fn worker_of_flow(&self, key: &FlowKey) -> usize {
        if self.workers == 1 {
            return 0;
        }
        (self.toeplitz.hash_flow(key) % self.workers) as usize
    }

    /// The worker that takes `frame`, dissected as `d`.
    #[inline]
    pub fn worker(&self, frame: &[u8], d: &Dissection) -> usize {
        self.worker_from(frame, d, self.direction(d))
    }

    /// The worker that takes `frame`, dissected as `d`, which entered the box from
    /// `direction` (a later stage of a cluster sees a packet an earlier stage rewrote: its
    /// addresses no longer say where it came from).
    #[inline]
    pub fn worker_from(&self, frame: &[u8], d: &Dissection, direction: Direction) -> usize {
        if self.workers == 1 {
            return 0;
        }
        let Some(mut key) = d.flow else { return 0 };
        let untracked = match d.fragment {
            Fragment::None | Fragment::Tracked => false,
            Fragment::First => d.network != Network::Ipv4,
            Fragment::Later => true,
        };
        if untracked {
            key.src_port = 0;
            key.dst_port = 0;
        } else if let Some(inner) = quoted_flow(frame, d) {
            if let Some(w) = self
                .owners
                .partition(&key, Some(&inner), direction, self.workers)
            {
                return w as usize;
            }
            key = inner;
        } else if let Some(w) = self.owners.partition(&key, None, direction, self.workers) {
            return w as usize;
        }
        self.worker_of_flow(&key)
    }
}

/// The flow an ICMP error message quotes, if `d` is one.
#[inline]
pub fn quoted_flow(frame: &[u8], d: &Dissection) -> Option<FlowKey> {
    let l4 = frame.get(d.l4_offset?..d.l3_end)?;
    match d.transport {
        Transport::Icmpv4 { kind, .. } if !matches!(kind, 0 | 8) => {
            icmp::v4::Packet::new_checked(l4).ok()?.inner_flow()
        }
        Transport::Icmpv6 { kind, .. } if kind < 128 => {
            icmp::v6::Packet::new_checked(l4).ok()?.inner_flow()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let p: IpPrefix = "10.0.0.0/8".parse().unwrap();
        assert!(p.contains("10.255.0.1".parse().unwrap()));
        assert!(!p.contains("11.0.0.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        let h: IpPrefix = "192.0.2.7".parse().unwrap();
        assert_eq!(h.len(), 32);
        assert!(h.contains("192.0.2.7".parse().unwrap()));
        let all: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        assert!(all.is_empty());
        let v6: IpPrefix = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fdab::1".parse().unwrap()));
        assert_eq!(
            "10.1.2.3/8".parse::<IpPrefix>().unwrap_err().to_string(),
            "10.1.2.3/8: host bits set; did you mean 10.0.0.0/8?"
        );
        assert_eq!(
            IpPrefix::new("10.1.2.3".parse().unwrap(), 8).to_string(),
            "10.0.0.0/8"
        );
        for bad in [
            "",
            "10.0.0.0/33",
            "fd00::/129",
            "banana",
            "10.0.0/8",
            "10.0.0.0/",
        ] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad}");
        }
    }
}
