//! Port forwarding (static mappings, as VPP's `nat44 add static mapping` or an nftables
//! `dnat`): an external endpoint published for an inside server.
//!
//! ```toml
//! forward = [
//!   { proto = "tcp", external = "203.0.113.1:80", internal = "10.0.0.10:8080" },
//!   { proto = "udp", external = "203.0.113.1:5000-5009", internal = "10.0.0.11:6000" },
//! ]
//! ```
//!
//! A range maps port `lo + k` to internal port `internal + k`. A forwarding is a mapping that
//! exists before any session: the inside endpoint goes out as the external one (endpoint-
//! independent mapping, RFC 4787 REQ-1), and a UDP packet or TCP SYN from anywhere to the
//! external endpoint opens a session whatever `filtering` says (the operator published it).
//! Forwarded external ports never enter the port pools.

use super::PortRange;
use flowstate_wire::flow::proto;
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::str::FromStr;

/// One `forward` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forward {
    /// `"tcp"` or `"udp"`.
    #[serde(deserialize_with = "deserialize_proto")]
    pub proto: u8,
    /// The published address (one of the NAT's `external` addresses) and port or ports.
    pub external: Ports,
    /// The inside server's address and (first) port.
    pub internal: SocketAddrV4,
}

impl Forward {
    /// The internal ports the rule maps to, in the order of its external ones.
    pub fn internal_ports(&self) -> (u16, u32) {
        let first = self.internal.port();
        (first, u32::from(first) + self.external.ports.len() - 1)
    }
}

/// An address and a range of ports, written `"address:port"` or `"address:lo-hi"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// The address.
    pub addr: Ipv4Addr,
    /// Its ports.
    pub ports: PortRange,
}

impl FromStr for Ports {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = || format!("expected \"ADDRESS:PORT\" or \"ADDRESS:LO-HI\", got {s:?}");
        let (addr, ports) = s.rsplit_once(':').ok_or_else(expected)?;
        Ok(Ports {
            addr: addr.parse().map_err(|_| expected())?,
            ports: ports.parse().map_err(|_| expected())?,
        })
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ports.lo == self.ports.hi {
            write!(f, "{}:{}", self.addr, self.ports.lo)
        } else {
            write!(f, "{}:{}", self.addr, self.ports)
        }
    }
}

impl<'de> Deserialize<'de> for Ports {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

fn deserialize_proto<'de, D: Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    match String::deserialize(d)?.as_str() {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        other => Err(serde::de::Error::custom(format!(
            "expected \"tcp\" or \"udp\", got {other:?}"
        ))),
    }
}

/// The `forward` rules, indexed both ways for lookups in O(log rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forwards {
    /// The rules as configured.
    rules: Vec<Forward>,
    /// Rule indices by (external address, protocol, first port).
    by_external: Vec<usize>,
    /// Rule indices by (internal address, protocol, first internal port).
    by_internal: Vec<usize>,
}

impl<'de> Deserialize<'de> for Forwards {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Forwards::new(Vec::deserialize(d)?))
    }
}

impl Forwards {
    /// The index of `rules`.
    pub fn new(rules: Vec<Forward>) -> Forwards {
        let mut by_external: Vec<usize> = (0..rules.len()).collect();
        by_external.sort_by_key(|&i| external_key(&rules[i]));
        let mut by_internal: Vec<usize> = (0..rules.len()).collect();
        by_internal.sort_by_key(|&i| internal_key(&rules[i]));
        Forwards {
            rules,
            by_external,
            by_internal,
        }
    }

    /// The rules, as configured.
    pub fn rules(&self) -> &[Forward] {
        &self.rules
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The inside endpoint external `(address, port)` of protocol `p` is forwarded to.
    #[inline]
    pub fn inside_of(&self, addr: Ipv4Addr, port: u16, p: u8) -> Option<(Ipv4Addr, u16)> {
        if self.rules.is_empty() {
            return None;
        }
        let at = self
            .by_external
            .partition_point(|&i| external_key(&self.rules[i]) <= (addr, p, port));
        let r = &self.rules[*self.by_external.get(at.checked_sub(1)?)?];
        let hit = r.external.addr == addr && r.proto == p && r.external.ports.contains(port);
        hit.then(|| {
            let k = port - r.external.ports.lo;
            (*r.internal.ip(), r.internal.port().wrapping_add(k))
        })
    }

    /// The external endpoint inside `(address, port)` of protocol `p` is published as.
    #[inline]
    pub fn outside_of(&self, addr: Ipv4Addr, port: u16, p: u8) -> Option<(Ipv4Addr, u16)> {
        if self.rules.is_empty() {
            return None;
        }
        let at = self
            .by_internal
            .partition_point(|&i| internal_key(&self.rules[i]) <= (addr, p, port));
        let r = &self.rules[*self.by_internal.get(at.checked_sub(1)?)?];
        let (lo, hi) = r.internal_ports();
        let hit = *r.internal.ip() == addr && r.proto == p && u32::from(port) <= hi;
        hit.then(|| (r.external.addr, r.external.ports.lo.wrapping_add(port - lo)))
    }

    /// Every published inside endpoint `(address, port, protocol)` with its external
    /// endpoint.
    pub fn endpoints(&self) -> impl Iterator<Item = ((Ipv4Addr, u16, u8), (Ipv4Addr, u16))> + '_ {
        self.rules.iter().flat_map(|r| {
            (r.external.ports.lo..=r.external.ports.hi).map(move |p| {
                let k = p - r.external.ports.lo;
                (
                    (*r.internal.ip(), r.internal.port().wrapping_add(k), r.proto),
                    (r.external.addr, p),
                )
            })
        })
    }

    /// Whether external `(address, port)` is forwarded for any protocol (kept out of the
    /// pools: a pool port is free for every protocol).
    pub fn reserves(&self, addr: Ipv4Addr, port: u16) -> bool {
        self.rules
            .iter()
            .any(|r| r.external.addr == addr && r.external.ports.contains(port))
    }

    /// What is wrong with the rules given the NAT's `external` addresses: `(rule index,
    /// reason)` for every problem.
    pub fn problems(&self, external: &[Ipv4Addr]) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            if !external.contains(&r.external.addr) {
                out.push((
                    i,
                    format!(
                        "{} is not one of the NAT's external addresses",
                        r.external.addr
                    ),
                ));
            }
            if external.contains(r.internal.ip()) {
                out.push((i, format!("internal {} is an external address", r.internal)));
            }
            let (lo, hi) = r.internal_ports();
            if lo == 0 || hi > u32::from(u16::MAX) {
                out.push((
                    i,
                    format!(
                        "internal ports {lo}-{hi} are not all in 1-65535 ({} external ports from {lo})",
                        r.external.ports.len()
                    ),
                ));
            }
        }
        let name = |p: u8| if p == proto::TCP { "tcp" } else { "udp" };
        for w in self.by_external.windows(2) {
            let (a, b) = (&self.rules[w[0]], &self.rules[w[1]]);
            if a.external.addr == b.external.addr
                && a.proto == b.proto
                && b.external.ports.lo <= a.external.ports.hi
            {
                out.push((
                    w[1].max(w[0]),
                    format!(
                        "{} {} overlaps {} {} of rule {}",
                        name(b.proto),
                        b.external,
                        name(a.proto),
                        a.external,
                        w[0].min(w[1])
                    ),
                ));
            }
        }
        for w in self.by_internal.windows(2) {
            let (a, b) = (&self.rules[w[0]], &self.rules[w[1]]);
            if a.internal.ip() == b.internal.ip()
                && a.proto == b.proto
                && u32::from(b.internal.port()) <= a.internal_ports().1
            {
                out.push((
                    w[1].max(w[0]),
                    format!(
                        "internal {} {} is forwarded by rule {} too: an inside endpoint has one \
                         external endpoint",
                        name(b.proto),
                        b.internal,
                        w[0].min(w[1])
                    ),
                ));
            }
        }
        out.sort();
        out
    }
}

fn external_key(r: &Forward) -> (Ipv4Addr, u8, u16) {
    (r.external.addr, r.proto, r.external.ports.lo)
}

fn internal_key(r: &Forward) -> (Ipv4Addr, u8, u16) {
    (*r.internal.ip(), r.proto, r.internal.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(p: u8, ext: &str, int: &str) -> Forward {
        Forward {
            proto: p,
            external: ext.parse().unwrap(),
            internal: int.parse().unwrap(),
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn lookups_agree_with_a_scan_of_every_port() {
        let rules = vec![
            rule(proto::UDP, "203.0.113.1:5000-5009", "10.0.0.11:6000"),
            rule(proto::TCP, "203.0.113.1:80", "10.0.0.10:8080"),
            rule(proto::TCP, "203.0.113.2:80", "10.0.0.12:80"),
            rule(proto::TCP, "203.0.113.1:443", "10.0.0.10:443"),
            rule(proto::TCP, "203.0.113.1:8000-8002", "10.0.0.10:9000"),
        ];
        let f = Forwards::new(rules.clone());
        assert!(f
            .problems(&[ip("203.0.113.1"), ip("203.0.113.2")])
            .is_empty());
        // The oracle: every rule, every port.
        let naive_in = |a: Ipv4Addr, port: u16, p: u8| {
            rules.iter().find_map(|r| {
                (r.external.addr == a && r.proto == p && r.external.ports.contains(port)).then(
                    || {
                        (
                            *r.internal.ip(),
                            r.internal.port() + (port - r.external.ports.lo),
                        )
                    },
                )
            })
        };
        for a in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
            for p in [proto::TCP, proto::UDP] {
                for port in (0..=10_000u16).chain([u16::MAX]) {
                    let want = naive_in(ip(a), port, p);
                    assert_eq!(f.inside_of(ip(a), port, p), want, "{a}:{port}/{p}");
                    if let Some((i, ip2)) = want {
                        assert_eq!(f.outside_of(i, ip2, p), Some((ip(a), port)));
                    }
                }
            }
        }
        assert_eq!(f.outside_of(ip("10.0.0.10"), 8081, proto::TCP), None);
        assert_eq!(f.outside_of(ip("10.0.0.10"), 8080, proto::UDP), None);
        assert_eq!(f.outside_of(ip("10.0.0.11"), 6010, proto::UDP), None);
        assert!(f.reserves(ip("203.0.113.1"), 5009));
        assert!(!f.reserves(ip("203.0.113.1"), 5010));
        assert_eq!(Forwards::default().inside_of(ip("1.2.3.4"), 1, 6), None);
    }

    #[test]
    fn every_problem_is_named_with_its_rule() {
        let f = Forwards::new(vec![
            rule(proto::TCP, "203.0.113.1:80-90", "10.0.0.10:80"),
            rule(proto::TCP, "203.0.113.1:85", "10.0.0.11:80"),
            rule(proto::UDP, "203.0.113.1:85", "10.0.0.11:80"),
            rule(proto::TCP, "203.0.113.9:1", "10.0.0.12:1"),
            rule(proto::TCP, "203.0.113.1:100", "10.0.0.10:85"),
            rule(proto::UDP, "203.0.113.1:200-300", "10.0.0.13:65500"),
            rule(proto::UDP, "203.0.113.1:400", "203.0.113.1:400"),
        ]);
        let p = f.problems(&[ip("203.0.113.1")]);
        let rules: Vec<usize> = p.iter().map(|(i, _)| *i).collect();
        assert_eq!(rules, [1, 3, 4, 5, 6], "{p:?}");
        assert!(p[0].1.contains("overlaps"), "{p:?}");
        assert!(p[1].1.contains("not one of the NAT's external"), "{p:?}");
        assert!(p[2].1.contains("rule 0 too"), "{p:?}");
        assert!(p[3].1.contains("65500-65600"), "{p:?}");
        assert!(p[4].1.contains("is an external address"), "{p:?}");
    }

    #[test]
    fn rules_parse_and_bad_ones_say_why() {
        let t: toml::Table =
            "forward = [{ proto = \"udp\", external = \"203.0.113.1:5000-5009\", internal = \"10.0.0.11:6000\" }]"
                .parse()
                .unwrap();
        #[derive(Deserialize)]
        struct T {
            forward: Forwards,
        }
        let f: T = t.try_into().unwrap();
        assert_eq!(
            f.forward.rules(),
            [rule(proto::UDP, "203.0.113.1:5000-5009", "10.0.0.11:6000")]
        );
        assert_eq!(
            f.forward.rules()[0].external.to_string(),
            "203.0.113.1:5000-5009"
        );
        for bad in [
            "203.0.113.1",
            "203.0.113.1:0",
            "x:80",
            "203.0.113.1:9-8",
            ":80",
        ] {
            assert!(bad.parse::<Ports>().is_err(), "{bad}");
        }
        let t: toml::Table =
            "forward = [{ proto = \"sctp\", external = \"203.0.113.1:1\", internal = \"10.0.0.1:1\" }]"
                .parse()
                .unwrap();
        let e = t.try_into::<T>().err().unwrap().to_string();
        assert!(e.contains("expected \"tcp\" or \"udp\""), "{e}");
    }
}
