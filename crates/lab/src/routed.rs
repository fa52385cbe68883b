//! A routed cluster network (`lab up --instances N --routed`): every role's host on a link of
//! its own to a router, no L2 segment shared between roles, so GENEVE between the root and the
//! instances is routed as it is between real hosts.
//!
//! ```text
//!                              router ns {prefix}rt (ip_forward=1, rp_filter=0)
//!   nf ns (root, controller)   rt-nf 10.200.0.1/30    192.0.2.1/32  via 10.200.0.2
//!   fs-rt 10.200.0.2/30  <-veth->  rt-nf              192.0.2.5/32  via 10.200.100.2
//!         192.0.2.1/32                                192.0.2.(10+k)/32 via 10.200.k.2
//!   store ns {prefix}st        rt-st 10.200.100.1/30
//!   fs-st 10.200.100.2/30 <-veth-> rt-st
//!         192.0.2.5/32
//!   instance ns {prefix}i{k}   rt-i{k} 10.200.k.1/30
//!   fs-i 10.200.k.2/30   <-veth->  rt-i{k}
//!        192.0.2.(10+k)/32
//! ```
//!
//! * Each host holds its role's address ([`ROOT_ADDR`], [`STORE_ADDR`],
//!   [`instance_addr`]`(k)`) as a /32 on its link, and a route `192.0.2.0/24 via` the router's
//!   end of its link with that address as the source; the router holds a /32 route to each
//!   role's address via the host's end. A host's only neighbour is the router's end of its
//!   link (10.200.K.1): every datagram between two roles crosses the router (one TTL).
//! * Every link has MTU [`CLUSTER_MTU`] (9000) on both ends: a root's GENEVE datagram (a
//!   1514-byte frame, 50 bytes of headers, the 36-byte trailer) is never fragmented.
//! * Reverse-path filtering is off (`rp_filter=0`: `all` and each link's, `default` in the
//!   namespaces made here) in the router and on every host, and hosts ask ARP from their link
//!   address (`arp_announce=2` on the link), so neither the routed sources nor neighbour
//!   resolution can drop a role's datagrams.
//! * The router has no route to the client's or the server's side, and the nf namespace still
//!   forwards nothing: the cluster network reaches neither.

use std::net::Ipv4Addr;

use crate::cluster::{instance_addr, CLUSTER_MTU, CLUSTER_NET, INSTANCE_IF, ROOT_ADDR};
use crate::ecmp::ROOT2_ADDR;
use crate::{Cmd, Exec, Lab, LabError};

/// The store's address in a routed lab (its namespace `{prefix}st`): a managed store listens
/// there.
pub const STORE_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 5);
/// The routed lab's links: host `K`'s link to the router is 10.200.K.0/30 (see
/// [`RoutedHost::link`]).
pub const ROUTED_LINKS: &str = "10.200.0.0/16";
/// The root host's interface to the router (in the nf namespace).
pub const NF_ROUTED_IF: &str = "fs-rt";
/// The store host's interface to the router (in the store namespace).
pub const STORE_IF: &str = "fs-st";

/// A host of the routed cluster network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutedHost {
    /// The nf namespace: the root and the controller ([`ROOT_ADDR`]).
    Root,
    /// The second root's namespace `{prefix}nf2` ([`ROOT2_ADDR`], [`Lab::second_root`]).
    SecondRoot,
    /// The store namespace ([`STORE_ADDR`]).
    Store,
    /// Instance `k`'s namespace ([`instance_addr`]`(k)`).
    Instance(u32),
}

impl RoutedHost {
    /// The third octet of its link, 10.200.K.0/30: 0 for the root's host, `k` for instance
    /// `k`, 100 for the store.
    fn net(self) -> u8 {
        match self {
            RoutedHost::Root => 0,
            RoutedHost::SecondRoot => 200,
            RoutedHost::Store => 100,
            RoutedHost::Instance(k) => {
                let _ = instance_addr(k); // checks k
                k as u8
            }
        }
    }

    /// Its link's addresses: (the router's end, the host's end).
    pub fn link(self) -> (Ipv4Addr, Ipv4Addr) {
        let n = self.net();
        (Ipv4Addr::new(10, 200, n, 1), Ipv4Addr::new(10, 200, n, 2))
    }

    /// Its role's address, a /32 on its link.
    pub fn addr(self) -> Ipv4Addr {
        match self {
            RoutedHost::Root => ROOT_ADDR,
            RoutedHost::SecondRoot => ROOT2_ADDR,
            RoutedHost::Store => STORE_ADDR,
            RoutedHost::Instance(k) => instance_addr(k),
        }
    }

    /// Its interface (in its own namespace).
    pub fn interface(self) -> &'static str {
        match self {
            RoutedHost::Root | RoutedHost::SecondRoot => NF_ROUTED_IF,
            RoutedHost::Store => STORE_IF,
            RoutedHost::Instance(_) => INSTANCE_IF,
        }
    }

    /// The router's end of its link (in the router namespace): `rt-nf`, `rt-st`, `rt-i{k}`.
    pub fn router_port(self) -> String {
        match self {
            RoutedHost::Root => "rt-nf".into(),
            RoutedHost::SecondRoot => "rt-nf2".into(),
            RoutedHost::Store => "rt-st".into(),
            RoutedHost::Instance(k) => format!("rt-i{k}"),
        }
    }
}

/// How much of a routed host's link the router forwards ([`Lab::cut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Nothing from the host to the store ([`STORE_ADDR`]).
    Store,
    /// Nothing from or to the host: a cable pulled.
    All,
    /// Everything again.
    None,
}

/// The router's nftables table of cuts.
const CUT_TABLE: &str = "fs_cut";

impl Lab {
    /// The commands that make the router forward of `host`'s link only what `how` says, with
    /// nftables in the router's namespace (setting the router's port down would also take its
    /// route to the host away, which nothing puts back). Cuts add up until [`Cut::None`].
    pub fn cut_plan(&self, host: RoutedHost, how: Cut) -> Vec<Cmd> {
        let ns = self.cluster_router_ns();
        let port = host.router_port();
        let store = STORE_ADDR.to_string();
        let nft = |args: &[&str]| {
            let mut argv = vec!["nft"];
            argv.extend(args);
            Cmd::new(&Lab::in_ns(&ns, &argv))
        };
        let mut plan = vec![
            nft(&["add", "table", "inet", CUT_TABLE]),
            nft(&[
                "add",
                "chain",
                "inet",
                CUT_TABLE,
                "forward",
                "{ type filter hook forward priority -10 ; }",
            ]),
        ];
        let rule = |args: &[&str]| {
            let mut a = vec!["add", "rule", "inet", CUT_TABLE, "forward"];
            a.extend(args);
            nft(&a)
        };
        match how {
            Cut::Store => plan.push(rule(&["iifname", &port, "ip", "daddr", &store, "drop"])),
            Cut::All => {
                plan.push(rule(&["iifname", &port, "drop"]));
                plan.push(rule(&["oifname", &port, "drop"]));
            }
            Cut::None => plan.push(nft(&["delete", "table", "inet", CUT_TABLE])),
        }
        plan
    }

    /// Runs [`Lab::cut_plan`].
    pub fn cut(&self, exec: &mut dyn Exec, host: RoutedHost, how: Cut) -> Result<(), LabError> {
        for cmd in self.cut_plan(host, how) {
            exec.run(&cmd)?;
        }
        Ok(())
    }

    /// Kills `host` as a host dies: every process in its namespace at once (SIGKILL), then its
    /// link cut ([`Cut::All`]).
    pub fn kill_host(&self, exec: &mut dyn Exec, host: RoutedHost) -> Result<(), LabError> {
        Lab::kill_all_in(exec, &self.routed_host_ns(host))?;
        self.cut(exec, host, Cut::All)
    }

    /// The routed lab's router namespace, `{prefix}rt`.
    pub fn cluster_router_ns(&self) -> String {
        format!("{}rt", self.prefix)
    }

    /// The routed lab's store namespace, `{prefix}st`.
    pub fn store_ns(&self) -> String {
        format!("{}st", self.prefix)
    }

    /// The namespace of a routed host.
    pub fn routed_host_ns(&self, h: RoutedHost) -> String {
        match h {
            RoutedHost::Root => self.nf_ns(),
            RoutedHost::SecondRoot => self.second_root_ns(),
            RoutedHost::Store => self.store_ns(),
            RoutedHost::Instance(k) => self.instance_ns(k),
        }
    }

    /// Whether `ns` is the routed lab's router, store or second root's namespace.
    pub(crate) fn routed_index(&self, ns: &str) -> bool {
        self.routed_namespaces().iter().any(|n| n == ns)
    }

    /// The routed lab's own namespaces: the router, the store's, the second root's.
    pub(crate) fn routed_namespaces(&self) -> [String; 3] {
        [
            self.cluster_router_ns(),
            self.store_ns(),
            self.second_root_ns(),
        ]
    }

    /// The commands that make a new namespace `ns` for the routed network: IPv4 only, `lo` up.
    pub(crate) fn routed_ns_plan(ns: &str) -> Vec<Cmd> {
        vec![
            Cmd::new(&["ip", "netns", "add", ns]),
            Cmd::new(&Lab::in_ns(
                ns,
                &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ))
            .may_fail(),
            Cmd::new(&Lab::in_ns(
                ns,
                &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
            ))
            .may_fail(),
            Cmd::new(&["ip", "-n", ns, "link", "set", "lo", "up"]),
        ]
    }

    /// `sysctl -qw` of each of `kv` in `ns`.
    pub(crate) fn sysctls(ns: &str, kv: &[&str]) -> Vec<Cmd> {
        kv.iter()
            .map(|kv| Cmd::new(&Lab::in_ns(ns, &["sysctl", "-qw", kv])))
            .collect()
    }

    /// The sysctls of a namespace of the routed network (before its link is made): no
    /// reverse-path filter (a link's own is set with it; the kernel takes the larger of `all`
    /// and the link's).
    pub(crate) fn routed_host_sysctls(ns: &str) -> Vec<Cmd> {
        Lab::sysctls(
            ns,
            &[
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        )
    }

    /// The commands that join host `h` (its namespace exists, with its sysctls) to the router:
    /// the veth, both ends' addresses, the host's route to the cluster network and the
    /// router's route to the host's address.
    pub fn routed_link_plan(&self, h: RoutedHost) -> Vec<Cmd> {
        let (rt, ns) = (self.cluster_router_ns(), self.routed_host_ns(h));
        let (dev, port) = (h.interface(), h.router_port());
        let (gw, me) = h.link();
        let (gw, me, addr) = (gw.to_string(), me.to_string(), h.addr().to_string());
        let ethtool_off = |ns: &str, dev: &str| {
            Cmd::new(&Lab::in_ns(
                ns,
                &["ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "off"],
            ))
        };
        let mut p = vec![
            Cmd::new(&[
                "ip",
                "link",
                "add",
                dev,
                "mtu",
                CLUSTER_MTU,
                "netns",
                &ns,
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "mtu",
                CLUSTER_MTU,
                "netns",
                &rt,
            ]),
            ethtool_off(&ns, dev),
            ethtool_off(&rt, &port),
        ];
        p.extend(Lab::sysctls(
            &rt,
            &[&format!("net.ipv4.conf.{port}.rp_filter=0")],
        ));
        p.extend(Lab::sysctls(
            &ns,
            &[
                &format!("net.ipv4.conf.{dev}.rp_filter=0"),
                // ARP asks from the link's own address, which the router has a route for.
                &format!("net.ipv4.conf.{dev}.arp_announce=2"),
            ],
        ));
        p.extend([
            Cmd::new(&[
                "ip",
                "-n",
                &rt,
                "addr",
                "add",
                &format!("{gw}/30"),
                "dev",
                &port,
            ]),
            Cmd::new(&["ip", "-n", &rt, "link", "set", &port, "up"]),
            Cmd::new(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{me}/30"),
                "dev",
                dev,
            ]),
            Cmd::new(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/32"),
                "dev",
                dev,
            ]),
            Cmd::new(&["ip", "-n", &ns, "link", "set", dev, "up"]),
            Cmd::new(&[
                "ip",
                "-n",
                &ns,
                "route",
                "add",
                CLUSTER_NET,
                "via",
                &gw,
                "dev",
                dev,
                "src",
                &addr,
            ]),
            Cmd::new(&[
                "ip",
                "-n",
                &rt,
                "route",
                "add",
                &format!("{addr}/32"),
                "via",
                &me,
                "dev",
                &port,
            ]),
        ]);
        p
    }

    /// The commands that make the routed network without its instances (the nf namespace
    /// exists): the router, the store's namespace, and the links of the root's host and the
    /// store's.
    pub fn routed_plan(&self) -> Vec<Cmd> {
        let (rt, st, nf) = (self.cluster_router_ns(), self.store_ns(), self.nf_ns());
        let mut p = Lab::routed_ns_plan(&rt);
        p.extend(Lab::sysctls(
            &rt,
            &[
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        ));
        p.extend(Lab::routed_ns_plan(&st));
        p.extend(Lab::routed_host_sysctls(&st));
        // The nf namespace's own links (`fs-in`, `fs-out`) keep their settings.
        p.extend(Lab::sysctls(&nf, &["net.ipv4.conf.all.rp_filter=0"]));
        p.extend(self.routed_link_plan(RoutedHost::Root));
        p.extend(self.routed_link_plan(RoutedHost::Store));
        p
    }

    /// The commands that make instance `k`'s namespace and link it to the router.
    pub fn routed_instance_plan(&self, k: u32) -> Vec<Cmd> {
        let i = self.instance_ns(k);
        let mut p = Lab::routed_ns_plan(&i);
        p.extend(Lab::routed_host_sysctls(&i));
        p.extend(self.routed_link_plan(RoutedHost::Instance(k)));
        p
    }

    /// The commands that remove the routed network but its instances (each may fail: what is
    /// not there is not removed): the root host's link first (its namespace stays, and a
    /// link deleted with a namespace goes only later), then the router and the store.
    pub(crate) fn routed_down_plan(&self) -> Vec<Cmd> {
        vec![
            Cmd::new(&["ip", "-n", &self.nf_ns(), "link", "del", NF_ROUTED_IF]).may_fail(),
            Cmd::new(&["ip", "netns", "del", &self.cluster_router_ns()]).may_fail(),
            Cmd::new(&["ip", "netns", "del", &self.store_ns()]).may_fail(),
        ]
    }

    /// Whether `dev` in `ns` is up with every address of `want`.
    fn link_has(
        exec: &mut dyn Exec,
        ns: &str,
        dev: &str,
        want: &[String],
    ) -> Result<bool, LabError> {
        Ok(Lab::brief_addr(exec, ns, dev)?
            .is_some_and(|(state, addrs)| state == "UP" && want.iter().all(|w| addrs.contains(w))))
    }

    /// Whether host `h`'s link is up with its addresses on both ends.
    fn routed_link_ok(&self, exec: &mut dyn Exec, h: RoutedHost) -> Result<bool, LabError> {
        let (gw, me) = h.link();
        Ok(Lab::link_has(
            exec,
            &self.routed_host_ns(h),
            h.interface(),
            &[format!("{me}/30"), format!("{}/32", h.addr())],
        )? && Lab::link_has(
            exec,
            &self.cluster_router_ns(),
            &h.router_port(),
            &[format!("{gw}/30")],
        )?)
    }

    /// Whether the router and the links of the root's host and the store's are up.
    pub(crate) fn routed_ok(&self, exec: &mut dyn Exec) -> Result<bool, LabError> {
        Ok(self.routed_link_ok(exec, RoutedHost::Root)?
            && self.routed_link_ok(exec, RoutedHost::Store)?)
    }

    /// Whether instance `k`'s link is up with its addresses.
    pub(crate) fn routed_instance_ok(&self, exec: &mut dyn Exec, k: u32) -> Result<bool, LabError> {
        self.routed_link_ok(exec, RoutedHost::Instance(k))
    }

    /// The cluster lines of [`Lab::describe`] for a routed lab.
    pub(crate) fn describe_routed(&self) -> String {
        let host = |h: RoutedHost| {
            let (gw, me) = h.link();
            format!(
                "{} {} ({} {me}/30, via {gw})",
                self.routed_host_ns(h),
                h.addr(),
                h.interface()
            )
        };
        let list: Vec<String> = (1..=self.instances)
            .map(|k| host(RoutedHost::Instance(k)))
            .collect();
        format!(
            "cluster     routed: {CLUSTER_NET} hosts, each on its own link ({ROUTED_LINKS}, mtu {CLUSTER_MTU}) to the router {} (not routed to client or server)\n\
             root        {} (root and controller)\n\
             store       {} (a managed store listens at {STORE_ADDR})\n\
             instances   {}\n",
            self.cluster_router_ns(),
            host(RoutedHost::Root),
            host(RoutedHost::Store),
            list.join(", "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(plan: &[Cmd]) -> Vec<String> {
        plan.iter().map(|c| c.argv.join(" ")).collect()
    }

    #[test]
    fn a_cut_drops_at_the_router_what_it_names_and_none_puts_everything_back() {
        let lab = Lab::new("t-").unwrap();
        let nft = "ip netns exec t-rt nft";
        let head = [
            format!("{nft} add table inet fs_cut"),
            format!(
                "{nft} add chain inet fs_cut forward {{ type filter hook forward priority -10 ; }}"
            ),
        ];
        let rule = |r: &str| format!("{nft} add rule inet fs_cut forward {r}");
        let with = |tail: &[String]| [&head[..], tail].concat();
        let host = RoutedHost::Instance(2);
        assert_eq!(
            lines(&lab.cut_plan(host, Cut::Store)),
            with(&[rule("iifname rt-i2 ip daddr 192.0.2.5 drop")])
        );
        assert_eq!(
            lines(&lab.cut_plan(host, Cut::All)),
            with(&[rule("iifname rt-i2 drop"), rule("oifname rt-i2 drop")])
        );
        assert_eq!(
            lines(&lab.cut_plan(host, Cut::None)),
            with(&[format!("{nft} delete table inet fs_cut")])
        );
    }
}
