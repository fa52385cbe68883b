//! Which way a packet goes and which partition (a host's worker, a cluster's partition)
//! takes it: the dispatcher's steering on one host and the root's in a cluster.
//!
//! * Direction: a packet whose source address is in one of the `inside` prefixes is
//!   [`Direction::Outbound`]; every other packet (non-IP ones included) is
//!   [`Direction::Inbound`].
//! * Worker: `toeplitz_symmetric(flow) % workers` (the NIC RSS hash with a symmetric key), so
//!   both directions of a flow reach one worker. IPv4 fragments hash as their flow: the
//!   first fragment has the ports, and the runtime's fragment tracker gives them
//!   to the later ones ([`Fragment::Tracked`]). Fragments without ports (IPv6 fragments, an
//!   untracked later fragment) hash on their addresses and protocol only (ports zeroed), as
//!   RSS does, so every fragment of a packet reaches the same worker. ICMP errors hash on
//!   the flow they quote, so they reach the worker of that flow.
//!   Non-IP packets go to worker 0.
//! * Ownership first: when the chain holds state that one worker owns (a NAT's external
//!   ports, an LB's connections), [`Owners`] sends the packet to that worker.

use crate::Direction;
use flowstate_config::{IpNet, PrefixMatch};
use flowstate_wire::dissect::{Fragment, Network, Transport};
use flowstate_wire::hash::Toeplitz;
use flowstate_wire::{icmp, Dissection, FlowKey};

mod owners;
pub use owners::Owners;

/// Classifies packets by direction and steers them to workers.
#[derive(Debug, Clone)]
pub struct Steering {
    inside: Vec<IpNet>,
    workers: u32,
    toeplitz: Toeplitz,
    owners: Owners,
}

impl Steering {
    /// Steering over `workers` workers (at least 1) with these inside prefixes.
    pub fn new(inside: Vec<IpNet>, workers: usize) -> Self {
        Steering {
            inside,
            workers: u32::try_from(workers.max(1)).unwrap_or(u32::MAX),
            toeplitz: Toeplitz::symmetric(),
            owners: Owners::default(),
        }
    }

    /// The same, steering by state ownership first.
    pub fn with_owners(mut self, owners: Owners) -> Self {
        self.owners = owners;
        self
    }

    /// The inside prefixes.
    pub fn inside(&self) -> &[IpNet] {
        &self.inside
    }

    /// The packet's direction.
    #[inline]
    pub fn direction(&self, d: &Dissection) -> Direction {
        match d.flow {
            Some(f) if self.inside.iter().any(|p| p.matches(&f.src)) => Direction::Outbound,
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
