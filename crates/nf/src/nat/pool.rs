//! A worker's share of the external endpoints (FlexState §V-A4): its ports of `ports`
//! ([`super::port_owner`]) on every external address, less the forwarded ones, and what a
//! reload of `forward` takes out of it or gives back.

use super::{port_owner, Config, Forwards};
use crate::Placement;
use flowstate_wire::hash;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// The external endpoints a worker's pools may hold. See the module documentation.
#[derive(Debug, Clone)]
pub(super) struct Share {
    lo: u16,
    hi: u16,
    worker: Placement,
    external: Vec<Ipv4Addr>,
    parity: bool,
    forwards: Forwards,
}

/// What a new `forward` changes in a share: the endpoints it takes out of the pool, those it
/// gives back (unless a mapping still holds one: it comes back when that ends), and the
/// rules it replaced.
#[derive(Debug, Default)]
pub(super) struct Reforward {
    pub(super) reserved: BTreeSet<(Ipv4Addr, u16)>,
    pub(super) freed: BTreeSet<(Ipv4Addr, u16)>,
    pub(super) old: Forwards,
}

impl Share {
    /// `worker`'s share under `config`.
    pub(super) fn new(config: &Config, worker: Placement) -> Share {
        Share {
            lo: config.ports.lo,
            hi: config.ports.hi,
            worker,
            external: config.external.clone(),
            parity: config.port_parity,
            forwards: config.forward.clone(),
        }
    }

    /// The share's free endpoints when no mapping holds any, address by address in
    /// configuration order, ports in increasing order.
    pub(super) fn endpoints(&self) -> impl Iterator<Item = (Ipv4Addr, u16)> + '_ {
        let first = u32::from(self.lo) + self.worker.partition;
        self.external.iter().flat_map(move |&a| {
            (first..=u32::from(self.hi))
                .step_by(self.worker.partitions.max(1) as usize)
                .map(move |p| (a, p as u16))
                .filter(move |&(a, p)| !self.forwards.reserves(a, p))
        })
    }

    /// Whether a free `(address, port)` goes to this worker's pool.
    #[inline]
    pub(super) fn holds(&self, a: Ipv4Addr, p: u16) -> bool {
        self.owns(a, p) && !self.forwards.reserves(a, p)
    }

    /// Whether `(address, port)` is in this worker's share of `ports`, forwarded or not.
    fn owns(&self, a: Ipv4Addr, p: u16) -> bool {
        (self.lo..=self.hi).contains(&p)
            && port_owner(p, self.lo, self.worker.partitions) == self.worker.partition
            && self.external.contains(&a)
    }

    /// Which list of an address's pool port `p` is kept in: 1 for odd ports under
    /// `port_parity`, else 0.
    #[inline]
    pub(super) fn list_of(&self, p: u16) -> usize {
        usize::from(self.parity) & usize::from(p & 1)
    }

    /// Takes the rules `forwards` in place of the running ones.
    pub(super) fn reforward(&mut self, forwards: &Forwards) -> Reforward {
        let old = std::mem::replace(&mut self.forwards, forwards.clone());
        let mut out = Reforward::default();
        for r in old.rules().iter().chain(forwards.rules()) {
            let a = r.external.addr;
            for p in r.external.ports.lo..=r.external.ports.hi {
                if !self.owns(a, p) {
                    continue;
                }
                match (old.reserves(a, p), forwards.reserves(a, p)) {
                    (false, true) => out.reserved.insert((a, p)),
                    (true, false) => out.freed.insert((a, p)),
                    _ => false,
                };
            }
        }
        out.old = old;
        out
    }

    /// A fingerprint of what the pools are filled from (stored beside them, so a restarted
    /// worker knows whether the store's pools are its own).
    pub(super) fn fingerprint(&self) -> u32 {
        let mut crc = hash::crc32c(&self.worker.partition.to_be_bytes());
        crc = hash::crc32c_append(crc, &self.worker.partitions.to_be_bytes());
        crc = hash::crc32c_append(crc, &self.lo.to_be_bytes());
        crc = hash::crc32c_append(crc, &self.hi.to_be_bytes());
        for a in &self.external {
            crc = hash::crc32c_append(crc, &a.octets());
        }
        if self.parity {
            crc = hash::crc32c_append(crc, b"parity");
        }
        for f in self.forwards.rules() {
            crc = hash::crc32c_append(crc, &f.external.addr.octets());
            crc = hash::crc32c_append(crc, &f.external.ports.lo.to_be_bytes());
            crc = hash::crc32c_append(crc, &f.external.ports.hi.to_be_bytes());
        }
        crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(forward: &str) -> Config {
        let text =
            format!("external = [\"203.0.113.1\"]\nports = \"1000-1009\"\nforward = [{forward}]\n");
        Config::from_table(&text.parse().unwrap()).unwrap()
    }

    const ONE: &str =
        "{ proto = \"tcp\", external = \"203.0.113.1:1002-1004\", internal = \"10.0.0.1:80\" }";
    const TWO: &str =
        "{ proto = \"udp\", external = \"203.0.113.1:1004-1006\", internal = \"10.0.0.2:80\" }";

    #[test]
    fn a_share_is_its_workers_ports_less_the_forwarded_ones() {
        let worker = Placement {
            stage: 0,
            partition: 0,
            partitions: 2,
        };
        let s = Share::new(&config(ONE), worker);
        let ports: Vec<u16> = s.endpoints().map(|(_, p)| p).collect();
        assert_eq!(ports, [1000, 1006, 1008]);
        let a = "203.0.113.1".parse().unwrap();
        assert!(s.holds(a, 1000) && !s.holds(a, 1002) && !s.holds(a, 1001));
        assert!(!s.holds("203.0.113.2".parse().unwrap(), 1000));
    }

    #[test]
    fn a_reload_names_what_it_reserves_and_frees_in_the_share() {
        let worker = Placement {
            stage: 0,
            partition: 0,
            partitions: 1,
        };
        let mut s = Share::new(&config(ONE), worker);
        let before = s.fingerprint();
        let r = s.reforward(&config(TWO).forward);
        let a: Ipv4Addr = "203.0.113.1".parse().unwrap();
        assert_eq!(r.reserved, BTreeSet::from([(a, 1005), (a, 1006)]));
        assert_eq!(r.freed, BTreeSet::from([(a, 1002), (a, 1003)]));
        assert_eq!(r.old, config(ONE).forward);
        assert!(s.holds(a, 1002) && !s.holds(a, 1005));
        assert_ne!(s.fingerprint(), before);
        assert_eq!(
            s.fingerprint(),
            Share::new(&config(TWO), worker).fingerprint()
        );
    }
}
