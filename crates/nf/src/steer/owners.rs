//! Steering by state ownership: a packet goes to the partition that holds the state its NFs
//! need (CHC §4.1), which each NF declares ([`NfFactory::partition`]); the runtime never
//! asks which NF it is. A NAT sends an inbound packet to the partition that owns its
//! destination port and an outbound one to its inside endpoint's; an LB sends both
//! directions of a connection to its client endpoint's. The first NF of the chain that names
//! a partition decides; when none does, the symmetric flow hash does ([`super::Steering`]).
//!
//! Partitions are the workers of one host or the traffic partitions of a cluster alike.

use crate::{Direction, NfFactory};
use flowstate_wire::FlowKey;
use std::sync::Arc;

/// Who owns which traffic: the chain's NFs, asked in order. See the module documentation.
#[derive(Clone, Default)]
pub struct Owners {
    chain: Vec<Arc<dyn NfFactory>>,
}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.chain.iter().map(|c| c.name()))
            .finish()
    }
}

impl Owners {
    /// The owners a chain's NFs declare.
    pub fn new(chain: &[Arc<dyn NfFactory>]) -> Owners {
        Owners {
            chain: chain.to_vec(),
        }
    }

    /// The partition (of `partitions`) that owns a packet of flow `key` coming from
    /// `direction`, if an NF names one. `quoted` is the flow an ICMP error quotes.
    #[inline]
    pub fn partition(
        &self,
        key: &FlowKey,
        quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        self.chain
            .iter()
            .find_map(|nf| nf.partition(key, quoted, direction, partitions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_wire::flow::proto;

    /// The owners of the `[[chain]]` entries of `text`.
    fn owners(text: &str) -> Owners {
        let file: toml::Table = text.parse().unwrap();
        let chain: Vec<_> = file["chain"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let mut options = e.as_table().unwrap().clone();
                let nf = options.remove("nf").unwrap();
                crate::registry::factory(nf.as_str().unwrap(), &options).unwrap()
            })
            .collect();
        Owners::new(&chain)
    }

    fn key(s: &str, d: &str, sp: u16, dp: u16, p: u8) -> FlowKey {
        FlowKey::new(s.parse().unwrap(), d.parse().unwrap(), sp, dp, p)
    }

    #[test]
    fn nat_inbound_goes_to_the_port_owner_and_outbound_to_its_endpoint() {
        let o = owners(
            "[[chain]]\nnf = \"firewall\"\n[[chain]]\nnf = \"nat\"\nexternal = [\"198.51.100.1\"]\nports = \"2000-3000\"\n",
        );
        let inb = Direction::Inbound;
        for port in 2000..2010u16 {
            let k = key("198.51.100.2", "198.51.100.1", 80, port, proto::TCP);
            assert_eq!(
                o.partition(&k, None, inb, 4),
                Some(u32::from(port - 2000) % 4)
            );
            // An ICMP error about a translated packet: its quoted source is external:port.
            let q = key("198.51.100.1", "198.51.100.2", port, 53, proto::UDP);
            let outer = key("198.51.100.2", "198.51.100.1", 0, 0, proto::ICMP);
            assert_eq!(
                o.partition(&outer, Some(&q), inb, 4),
                Some(u32::from(port - 2000) % 4)
            );
        }
        // Outbound: every flow of one inside endpoint meets its one mapping.
        let out = Direction::Outbound;
        let a = key("10.0.0.2", "198.51.100.2", 40000, 80, proto::TCP);
        let b = key("10.0.0.2", "198.51.100.9", 40000, 443, proto::TCP);
        let p = o.partition(&a, None, out, 16).unwrap();
        assert_eq!(o.partition(&b, None, out, 16), Some(p));
        let spread: std::collections::HashSet<_> = (40000..40064u16)
            .filter_map(|sp| {
                o.partition(
                    &key("10.0.0.2", "198.51.100.2", sp, 80, proto::TCP),
                    None,
                    out,
                    16,
                )
            })
            .collect();
        assert!(
            spread.len() > 8,
            "endpoints spread over partitions: {spread:?}"
        );
        // Not translated (IPv6, inbound to another address): the flow hash decides.
        let v6 = key("fd00::2", "2001:db8::1", 1, 2, proto::TCP);
        assert_eq!(o.partition(&v6, None, out, 4), None);
        let other = key("198.51.100.2", "10.0.0.2", 80, 40000, proto::TCP);
        assert_eq!(o.partition(&other, None, inb, 4), None);
    }

    #[test]
    fn lb_both_directions_go_to_the_client_endpoint_partition() {
        let o = owners(
            "[[chain]]\nnf = \"lb\"\nvips = [{ vip = \"203.0.113.10\", port = 8080, backends = [\"198.51.100.2\", \"198.51.100.3:9000\"] }]\n",
        );
        let (out, inb) = (Direction::Outbound, Direction::Inbound);
        for cport in 40000..40050u16 {
            let to_vip = key("10.0.0.2", "203.0.113.10", cport, 8080, proto::TCP);
            let w = o.partition(&to_vip, None, out, 3).unwrap();
            let from_a = key("198.51.100.2", "10.0.0.2", 8080, cport, proto::TCP);
            let from_b = key("198.51.100.3", "10.0.0.2", 9000, cport, proto::TCP);
            assert_eq!(o.partition(&from_a, None, inb, 3), Some(w));
            assert_eq!(o.partition(&from_b, None, inb, 3), Some(w));
        }
        // Connections spread (a symmetric Toeplitz hash of one endpoint gave them all one).
        let spread: std::collections::HashSet<_> = (40000..40050u16)
            .filter_map(|cport| {
                let k = key("10.0.0.2", "203.0.113.10", cport, 8080, proto::TCP);
                o.partition(&k, None, out, 3)
            })
            .collect();
        assert_eq!(spread.len(), 3);
        // UDP to the TCP service: no rule.
        let u = key("10.0.0.2", "203.0.113.10", 1, 8080, proto::UDP);
        assert_eq!(o.partition(&u, None, out, 3), None);
        let fw = owners("[[chain]]\nnf = \"firewall\"\n");
        let k = key("10.0.0.2", "198.51.100.2", 1, 2, proto::TCP);
        assert_eq!(fw.partition(&k, None, out, 3), None);
    }
}
