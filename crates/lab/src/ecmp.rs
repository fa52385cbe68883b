//! A second root behind ECMP ([`Lab::second_root`], on a routed lab): two roots take traffic
//! at once, the client's and the server's namespaces spread flows over them as an upstream
//! router does, and a dead root's flows move to the other by the kernel's own health check.
//!
//! ```text
//!   client ns                      nf ns (root 0)                    server ns
//!   fs-c  10.0.0.2 ──veth── fs-in 10.0.0.1 │ fs-out 198.51.100.1 ──veth── fs-s  198.51.100.2/.3
//!   fs-c2 (no addr)──veth── fs-in 10.0.0.1 │ fs-out 198.51.100.1 ──veth── fs-s2 (no addr)
//!                                  {prefix}nf2 (root 1), fs-rt 192.0.2.2 to the router
//! ```
//!
//! * Both roots answer ARP for the same box addresses on their own links (the deployment's
//!   `[input]`/`[output]` are the same file on both hosts): the client's default route and
//!   the server's routes to the inside network and to the box's outside address (the NAT's)
//!   are multipath over the two links, hashed on the 5-tuple (`fib_multipath_hash_policy=1`),
//!   so each flow takes one root and the flows spread over both. Any root takes any flow
//!   (the state is in the store), so a flow's two directions may cross different roots.
//! * **Health check** (a routing daemon's BFD in a real network): a checker in the client's
//!   and in the server's namespace (`ecmp_check.py`) asks each link's gateway for its MAC
//!   (ARP) every 100 ms. A root answers ARP from its process, so a dead root stops answering;
//!   after 3 missed answers its path leaves the multipath routes, and one answer brings it
//!   back. The kernel's own neighbour check (`fib_multipath_use_neigh`) is not enough here:
//!   the client and the server are hosts, and a host's connected sockets keep the path they
//!   looked up until a route changes. The dead root's flows then hash to the other root; the
//!   packets in flight at it are lost, as on any router, and TCP sends them again.
//! * The second root's host is a routed host ([`RoutedHost::SecondRoot`], [`ROOT2_ADDR`]) with
//!   its link to the cluster router like the first's; its namespace forwards nothing.

use std::net::Ipv4Addr;

use crate::routed::RoutedHost;
use crate::{
    Cmd, Exec, Lab, LabError, BOX_INSIDE, BOX_OUTSIDE, CLIENT, CLIENT_IF, INSIDE_NET, NF_INSIDE_IF,
    NF_OUTSIDE_IF, SERVER, SERVER_IF,
};

/// The second root's address on the cluster network.
pub const ROOT2_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The client's link to the second root.
pub const CLIENT2_IF: &str = "fs-c2";
/// The server's link to the second root.
pub const SERVER2_IF: &str = "fs-s2";

/// The path checker (see the module documentation).
const CHECKER: &str = include_str!("ecmp_check.py");

/// One namespace's path checker.
struct Checker {
    ns: String,
    /// The box address both links lead to.
    gateway: Ipv4Addr,
    /// The address its ARP requests come from.
    source: Ipv4Addr,
    /// The links, one to each root.
    links: [&'static str; 2],
    /// The multipath routes it keeps over the links that answer.
    routes: Vec<String>,
}

impl Lab {
    /// The second root's namespace, `{prefix}nf2`.
    pub fn second_root_ns(&self) -> String {
        format!("{}nf2", self.prefix)
    }

    /// The commands that add (`on`) or remove the second root's host and the multipath
    /// routes over both roots (see the module documentation); the lab must be up and routed.
    pub fn second_root_plan(&self, on: bool) -> Vec<Cmd> {
        let (c, s, r) = (self.client_ns(), self.server_ns(), self.second_root_ns());
        let (inside, outside) = (BOX_INSIDE.to_string(), BOX_OUTSIDE.to_string());
        let ip = |ns: &str, args: &[&str]| {
            let mut argv = vec!["ip", "-n", ns];
            argv.extend(args);
            Cmd::new(&argv)
        };
        let over_both = |via: &str, one: &str, two: &str| -> Vec<String> {
            ["nexthop", "via", via, "dev", one, "onlink"]
                .iter()
                .chain(&["nexthop", "via", via, "dev", two, "onlink"])
                .map(|s| s.to_string())
                .collect()
        };
        let route = |ns: &str, to: &str, tail: Vec<String>| {
            let mut argv: Vec<String> = ["ip", "-n", ns, "route", "replace", to]
                .iter()
                .map(|s| s.to_string())
                .collect();
            argv.extend(tail);
            Cmd {
                argv,
                may_fail: false,
            }
        };
        let box_host = format!("{outside}/32");
        if !on {
            return vec![
                Cmd::new(&["ip", "netns", "del", &r]).may_fail(),
                route(
                    &c,
                    "default",
                    vec!["via".into(), inside, "dev".into(), CLIENT_IF.into()],
                )
                .may_fail(),
                route(
                    &s,
                    INSIDE_NET,
                    vec!["via".into(), outside, "dev".into(), SERVER_IF.into()],
                )
                .may_fail(),
                ip(&s, &["route", "del", &box_host]).may_fail(),
            ];
        }
        let mut p = Lab::routed_ns_plan(&r);
        p.extend(Lab::routed_host_sysctls(&r));
        p.extend(Lab::sysctls(&r, &["net.ipv4.ip_forward=0"]));
        for (peer_ns, peer, port) in [
            (&c, CLIENT2_IF, NF_INSIDE_IF),
            (&s, SERVER2_IF, NF_OUTSIDE_IF),
        ] {
            p.push(Cmd::new(&[
                "ip", "link", "add", peer, "netns", peer_ns, "type", "veth", "peer", "name", port,
                "netns", &r,
            ]));
            for (ns, dev) in [(peer_ns.as_str(), peer), (r.as_str(), port)] {
                p.push(Cmd::new(&Lab::in_ns(
                    ns,
                    &["ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "off"],
                )));
                p.push(ip(ns, &["link", "set", dev, "up"]));
            }
        }
        p.extend(self.routed_link_plan(RoutedHost::SecondRoot));
        for (ns, devs) in [(&c, [CLIENT_IF, CLIENT2_IF]), (&s, [SERVER_IF, SERVER2_IF])] {
            let mut kv: Vec<String> = vec![
                "net.ipv4.fib_multipath_hash_policy=1".into(),
                "net.ipv4.conf.all.rp_filter=0".into(),
            ];
            kv.extend(
                devs.iter()
                    .map(|dev| format!("net.ipv4.conf.{dev}.rp_filter=0")),
            );
            let kv: Vec<&str> = kv.iter().map(String::as_str).collect();
            p.extend(Lab::sysctls(ns, &kv));
        }
        p.push(route(
            &c,
            "default",
            over_both(&inside, CLIENT_IF, CLIENT2_IF),
        ));
        p.push(route(
            &s,
            INSIDE_NET,
            over_both(&outside, SERVER_IF, SERVER2_IF),
        ));
        p.push(route(
            &s,
            &box_host,
            over_both(&outside, SERVER_IF, SERVER2_IF),
        ));
        p
    }

    /// The path checkers: the client's and the server's.
    fn checkers(&self) -> [Checker; 2] {
        [
            Checker {
                ns: self.client_ns(),
                gateway: BOX_INSIDE,
                source: CLIENT,
                links: [CLIENT_IF, CLIENT2_IF],
                routes: vec!["default".into()],
            },
            Checker {
                ns: self.server_ns(),
                gateway: BOX_OUTSIDE,
                source: SERVER,
                links: [SERVER_IF, SERVER2_IF],
                routes: vec![INSIDE_NET.into(), format!("{BOX_OUTSIDE}/32")],
            },
        ]
    }

    fn checker_pids(&self) -> std::path::PathBuf {
        self.state_dir().join("ecmp-check.pids")
    }

    /// Stops the path checkers, if any run.
    pub(crate) fn stop_checkers(&self, exec: &mut dyn Exec) {
        if let Ok(pids) = std::fs::read_to_string(self.checker_pids()) {
            for pid in pids.lines().filter_map(|l| l.parse().ok()) {
                if exec.alive(pid, "python3") {
                    exec.kill(pid);
                }
            }
            let _ = std::fs::remove_file(self.checker_pids());
        }
    }

    /// Adds (`on`) or removes the second root's host ([`Lab::second_root_plan`]) and the path
    /// checkers; on a lab that is not up and routed, [`LabError::NotUp`].
    pub fn second_root(&self, exec: &mut dyn Exec, on: bool) -> Result<(), LabError> {
        self.stop_checkers(exec);
        if on && !self.status(exec)?.routed {
            return Err(LabError::NotUp {
                prefix: self.prefix.clone(),
                what: "the routed cluster network",
                flag: " --instances N --routed",
            });
        }
        for cmd in self.second_root_plan(on) {
            exec.run(&cmd)?;
        }
        if !on {
            return Ok(());
        }
        let mut pids = String::new();
        for c in self.checkers() {
            let (gw, src) = (c.gateway.to_string(), c.source.to_string());
            let links = c.links.join(",");
            let mut argv = vec!["python3", "-c", CHECKER, &gw, &src, &links];
            argv.extend(c.routes.iter().map(String::as_str));
            let log = self.state_dir().join(format!("ecmp-check-{}.log", c.ns));
            let pid = exec.spawn(&Cmd::new(&Lab::in_ns(&c.ns, &argv)), &log)?;
            pids.push_str(&format!("{pid}\n"));
        }
        let path = self.checker_pids();
        std::fs::write(&path, pids).map_err(|source| LabError::Io { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_root_host_gets_the_box_ports_and_routes_over_both_roots() {
        let lab = Lab::new("u").unwrap().with_instances(2).unwrap();
        let lines: Vec<String> = lab.second_root_plan(true).iter().map(Cmd::line).collect();
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(has("ip netns add unf2"), "{lines:#?}");
        assert!(has(
            "fs-c2 netns uclient type veth peer name fs-in netns unf2"
        ));
        assert!(has(
            "fs-s2 netns userver type veth peer name fs-out netns unf2"
        ));
        // Its link to the cluster router, at its own address.
        assert!(has("192.0.2.2/32 dev fs-rt"));
        assert!(has("route add 192.0.2.2/32 via 10.200.200.2 dev rt-nf2"));
        let both = |via: &str, one: &str, two: &str| {
            format!("nexthop via {via} dev {one} onlink nexthop via {via} dev {two} onlink")
        };
        assert!(has(&format!(
            "route replace default {}",
            both("10.0.0.1", CLIENT_IF, CLIENT2_IF)
        )));
        for to in [INSIDE_NET, "198.51.100.1/32"] {
            assert!(has(&format!(
                "route replace {to} {}",
                both("198.51.100.1", SERVER_IF, SERVER2_IF)
            )));
        }
        // Off: the host goes and the single paths come back.
        let off: Vec<String> = lab.second_root_plan(false).iter().map(Cmd::line).collect();
        assert!(off.iter().any(|l| l.contains("ip netns del unf2")));
        assert!(off
            .iter()
            .any(|l| l.contains("route replace default via 10.0.0.1 dev fs-c")));
        assert!(lab.owns("unf2"));
    }
}
