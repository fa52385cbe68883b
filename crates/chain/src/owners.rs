//! Steering by state ownership: packets whose flow state lives at one worker go there, even
//! when the symmetric hash of their 5-tuple says otherwise.
//!
//! * **NAT** (FlexState §V-A4): worker `k` hands out the external ports `p` with
//!   [`port_owner`]`(p, lo, workers) == k`. An inbound packet to an external address goes to
//!   the owner of its destination port (ICMP echo: the identifier), because its 5-tuple
//!   (server → external) hashes unlike the outbound one (client → server) that made the
//!   mapping. An ICMP error quoting a translated packet goes to the owner of the quoted source
//!   port.
//! * **Load balancer**: a connection is client → VIP one way and backend → client the other;
//!   both go to the worker of the client endpoint (address, port), which is the part the two
//!   directions share.
//!
//! Anything else keeps the symmetric hash ([`crate::steer`]). Lookups scan short lists (one
//! entry per external address, VIP service, backend) and allocate nothing.

use crate::config::ChainEntry;
use flowstate_nf::nat::port_owner;
use flowstate_wire::flow::proto;
use flowstate_wire::hash::Toeplitz;
use flowstate_wire::FlowKey;
use std::net::{IpAddr, SocketAddr};

/// Who owns which traffic. See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    /// NAT external addresses, each with the first port of its range.
    nat: Vec<(IpAddr, u16)>,
    /// LB services: (VIP, port, protocol).
    services: Vec<(IpAddr, u16, u8)>,
    /// LB backends: (address, port, protocol).
    backends: Vec<(IpAddr, u16, u8)>,
}

impl Owners {
    /// The owners a chain implies: its NATs' external ranges and its LBs' services and
    /// backends. Entries that do not parse are left out (building the chain reports them).
    pub fn from_chain(chain: &[ChainEntry]) -> Owners {
        let mut o = Owners::default();
        for e in chain {
            match e.nf.as_str() {
                "nat" => {
                    if let Ok(c) = flowstate_nf::nat::Config::from_table(&e.options) {
                        for a in c.external {
                            o.nat.push((IpAddr::V4(a), c.ports.lo));
                        }
                    }
                }
                "lb" => {
                    if let Ok(c) = flowstate_nf::lb::Config::from_table(&e.options) {
                        for v in &c.vips {
                            let (Ok(vip), Ok(port)) =
                                (v.vip.parse::<IpAddr>(), u16::try_from(v.port))
                            else {
                                continue;
                            };
                            let p = match v.proto.as_deref() {
                                Some("udp") => proto::UDP,
                                _ => proto::TCP,
                            };
                            o.services.push((vip, port, p));
                            for b in &v.backends {
                                let addr = b
                                    .parse::<SocketAddr>()
                                    .map(|s| (s.ip(), s.port()))
                                    .or_else(|_| b.parse::<IpAddr>().map(|ip| (ip, port)));
                                if let Ok((ip, bp)) = addr {
                                    o.backends.push((ip, bp, p));
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        o
    }

    /// Whether no rule applies (plain symmetric hashing).
    pub fn is_empty(&self) -> bool {
        self.nat.is_empty() && self.services.is_empty() && self.backends.is_empty()
    }

    /// The worker (of `workers`) that owns a packet with flow `key`, if a rule applies.
    /// `quoted` is the flow an ICMP error quotes.
    #[inline]
    pub fn worker(
        &self,
        key: &FlowKey,
        quoted: Option<&FlowKey>,
        workers: u32,
        toeplitz: &Toeplitz,
    ) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        if let Some(q) = quoted {
            // The quoted packet went out translated: external → server.
            if let Some(&(_, lo)) = self.nat.iter().find(|(a, _)| *a == q.src) {
                return Some(port_owner(q.src_port, lo, workers) as usize);
            }
            return None;
        }
        if let Some(&(_, lo)) = self.nat.iter().find(|(a, _)| *a == key.dst) {
            return Some(port_owner(key.dst_port, lo, workers) as usize);
        }
        let client = if self.services.contains(&(key.dst, key.dst_port, key.proto)) {
            Some((key.src, key.src_port))
        } else if self.backends.contains(&(key.src, key.src_port, key.proto)) {
            Some((key.dst, key.dst_port))
        } else {
            None
        };
        client.map(|(ip, port)| {
            let k = FlowKey::new(ip, ip, port, port, key.proto);
            (toeplitz.hash_flow(&k) % workers.max(1)) as usize
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(text: &str) -> Vec<ChainEntry> {
        let config =
            crate::Config::parse(&format!("[input]\npcap = \"x.pcap\"\n{text}"), "test.toml")
                .unwrap();
        config.chain
    }

    fn key(s: &str, d: &str, sp: u16, dp: u16, p: u8) -> FlowKey {
        FlowKey::new(s.parse().unwrap(), d.parse().unwrap(), sp, dp, p)
    }

    #[test]
    fn nat_inbound_goes_to_the_port_owner() {
        let o = Owners::from_chain(&chain(
            "[[chain]]\nnf = \"nat\"\nexternal = [\"198.51.100.1\"]\nports = \"2000-3000\"\n",
        ));
        let t = Toeplitz::symmetric();
        for port in 2000..2010u16 {
            let k = key("198.51.100.2", "198.51.100.1", 80, port, proto::TCP);
            assert_eq!(
                o.worker(&k, None, 4, &t),
                Some(usize::from(port - 2000) % 4)
            );
            // An ICMP error about a translated packet: its quoted source is external:port.
            let q = key("198.51.100.1", "198.51.100.2", port, 53, proto::UDP);
            let outer = key("198.51.100.2", "198.51.100.1", 0, 0, proto::ICMP);
            assert_eq!(
                o.worker(&outer, Some(&q), 4, &t),
                Some(usize::from(port - 2000) % 4)
            );
        }
        // Outbound packets: no rule, the symmetric hash decides.
        let out = key("10.0.0.2", "198.51.100.2", 40000, 80, proto::TCP);
        assert_eq!(o.worker(&out, None, 4, &t), None);
    }

    #[test]
    fn lb_both_directions_go_to_the_client_endpoint_worker() {
        let o = Owners::from_chain(&chain(
            "[[chain]]\nnf = \"lb\"\nvips = [{ vip = \"203.0.113.10\", port = 8080, backends = [\"198.51.100.2\", \"198.51.100.3:9000\"] }]\n",
        ));
        let t = Toeplitz::symmetric();
        for cport in 40000..40050u16 {
            let to_vip = key("10.0.0.2", "203.0.113.10", cport, 8080, proto::TCP);
            let w = o.worker(&to_vip, None, 3, &t).unwrap();
            let from_a = key("198.51.100.2", "10.0.0.2", 8080, cport, proto::TCP);
            let from_b = key("198.51.100.3", "10.0.0.2", 9000, cport, proto::TCP);
            assert_eq!(o.worker(&from_a, None, 3, &t), Some(w));
            assert_eq!(o.worker(&from_b, None, 3, &t), Some(w));
        }
        // UDP to the TCP service: no rule.
        let u = key("10.0.0.2", "203.0.113.10", 1, 8080, proto::UDP);
        assert_eq!(o.worker(&u, None, 3, &t), None);
        assert!(Owners::from_chain(&chain("[[chain]]\nnf = \"firewall\"\n")).is_empty());
    }
}
