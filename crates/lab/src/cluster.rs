//! Instance namespaces on a cluster network inside the nf namespace (`lab up --instances N`).
//!
//! ```text
//!  nf ns                                          instance ns {prefix}i{k}, k = 1..=N
//!  bridge fs-cl 192.0.2.1/24 ── fs-cl{k} <-veth->  fs-i 192.0.2.(10+k)/24, lo up
//!  (root, controller, managed store listen here)   no routes beyond 192.0.2.0/24
//! ```
//!
//! The nf namespace keeps `ip_forward=0`: the instances reach 192.0.2.1 and each other across
//! the bridge, nothing else.
//!
//! With [`Lab::with_routed`] (`lab up --instances N --routed`) the same addresses are hosts on
//! links of their own to a router instead of one bridge (the `routed` module); [`Lab::up`]
//! replaces one kind of network with the other.

use std::net::Ipv4Addr;

use crate::{Cmd, Exec, Lab, LabError};

/// The cluster network (in the nf namespace, on the bridge [`CLUSTER_BRIDGE`]).
pub const CLUSTER_NET: &str = "192.0.2.0/24";
/// The nf namespace's address on the cluster network: where the root, the controller and a
/// managed store listen.
pub const ROOT_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// At most this many instance namespaces.
pub const MAX_INSTANCES: u32 = 16;
/// The cluster network's bridge (in the nf namespace).
pub const CLUSTER_BRIDGE: &str = "fs-cl";
/// The cluster network's MTU: a root's GENEVE frame is a 1514-byte Ethernet frame plus 50
/// bytes of headers, which a 1500-byte network would fragment, every full-size packet twice.
pub const CLUSTER_MTU: &str = "9000";
/// An instance's interface (in its namespace).
pub const INSTANCE_IF: &str = "fs-i";
/// The cluster bridge's MAC address (locally administered; 192.0.2.1 in its last bytes).
pub const CLUSTER_BRIDGE_MAC: &str = "02:00:c0:00:02:01";

/// Instance `k`'s address, 192.0.2.(10+k). Panics unless `k` is in 1..=[`MAX_INSTANCES`].
pub fn instance_addr(k: u32) -> Ipv4Addr {
    assert!(
        (1..=MAX_INSTANCES).contains(&k),
        "instance {k}: instances are numbered 1 to {MAX_INSTANCES}"
    );
    Ipv4Addr::new(192, 0, 2, 10 + k as u8)
}

/// The nf namespace's end of instance `k`'s veth (a port of [`CLUSTER_BRIDGE`]): `fs-cl{k}`.
pub fn instance_port(k: u32) -> String {
    format!("{CLUSTER_BRIDGE}{k}")
}

impl Lab {
    /// Instance `k`'s namespace, `{prefix}i{k}` (instances are numbered from 1).
    pub fn instance_ns(&self, k: u32) -> String {
        format!("{}i{k}", self.prefix)
    }

    /// `k` if `ns` is an instance namespace of this lab (`{prefix}i` and digits only).
    pub(crate) fn instance_index(&self, ns: &str) -> Option<u64> {
        let digits = ns.strip_prefix(&self.prefix)?.strip_prefix('i')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Digits beyond u64 are still ours (down removes them): sorted last.
        Some(digits.parse().unwrap_or(u64::MAX))
    }

    /// The commands that make the cluster network but its instances (the nf namespace exists):
    /// the cluster bridge in the nf namespace, or with [`Lab::with_routed`] the router, the
    /// store's namespace and their links ([`Lab::routed_plan`]).
    pub fn cluster_plan(&self) -> Vec<Cmd> {
        if self.routed {
            return self.routed_plan();
        }
        let n = self.nf_ns();
        vec![
            Cmd::new(&[
                "ip",
                "-n",
                &n,
                "link",
                "add",
                CLUSTER_BRIDGE,
                // A fixed address: a bridge otherwise takes its ports' lowest MAC, which changes
                // as instances come and go, and the others' ARP entries for 192.0.2.1 go stale.
                "address",
                CLUSTER_BRIDGE_MAC,
                "mtu",
                CLUSTER_MTU,
                "type",
                "bridge",
                "forward_delay",
                "0",
            ]),
            Cmd::new(&Lab::in_ns(
                &n,
                &[
                    "ethtool",
                    "-K",
                    CLUSTER_BRIDGE,
                    "tx",
                    "off",
                    "rx",
                    "off",
                    "gro",
                    "off",
                ],
            )),
            Cmd::new(&[
                "ip",
                "-n",
                &n,
                "addr",
                "add",
                &format!("{ROOT_ADDR}/24"),
                "dev",
                CLUSTER_BRIDGE,
            ]),
            Cmd::new(&["ip", "-n", &n, "link", "set", CLUSTER_BRIDGE, "up"]),
        ]
    }

    /// The commands that make instance `k`'s namespace and join it to the cluster bridge (or
    /// with [`Lab::with_routed`] link it to the router: [`Lab::routed_instance_plan`]).
    pub fn instance_plan(&self, k: u32) -> Vec<Cmd> {
        if self.routed {
            return self.routed_instance_plan(k);
        }
        let (n, i) = (self.nf_ns(), self.instance_ns(k));
        let port = instance_port(k);
        let ethtool_off = |ns: &str, dev: &str| {
            Cmd::new(&Lab::in_ns(
                ns,
                &["ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "off"],
            ))
        };
        vec![
            Cmd::new(&["ip", "netns", "add", &i]),
            Cmd::new(&[
                "ip",
                "link",
                "add",
                INSTANCE_IF,
                "mtu",
                CLUSTER_MTU,
                "netns",
                &i,
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "mtu",
                CLUSTER_MTU,
                "netns",
                &n,
            ]),
            Cmd::new(&Lab::in_ns(
                &i,
                &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ))
            .may_fail(),
            Cmd::new(&Lab::in_ns(
                &i,
                &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
            ))
            .may_fail(),
            Cmd::new(&["ip", "-n", &i, "link", "set", "lo", "up"]),
            ethtool_off(&i, INSTANCE_IF),
            ethtool_off(&n, &port),
            Cmd::new(&[
                "ip",
                "-n",
                &n,
                "link",
                "set",
                &port,
                "master",
                CLUSTER_BRIDGE,
            ]),
            Cmd::new(&["ip", "-n", &n, "link", "set", &port, "up"]),
            Cmd::new(&[
                "ip",
                "-n",
                &i,
                "addr",
                "add",
                &format!("{}/24", instance_addr(k)),
                "dev",
                INSTANCE_IF,
            ]),
            Cmd::new(&["ip", "-n", &i, "link", "set", INSTANCE_IF, "up"]),
        ]
    }

    /// `ip -br -4 addr show dev DEV` in `ns`: (state, addresses), or `None` if there is no
    /// such device (or namespace).
    pub(crate) fn brief_addr(
        exec: &mut dyn Exec,
        ns: &str,
        dev: &str,
    ) -> Result<Option<(String, Vec<String>)>, LabError> {
        let out = exec.run(
            &Cmd::new(&["ip", "-n", ns, "-br", "-4", "addr", "show", "dev", dev]).may_fail(),
        )?;
        Ok(parse_brief(&out)
            .into_iter()
            .find(|(d, _, _)| d == dev)
            .map(|(_, st, a)| (st, a)))
    }

    /// Whether the cluster bridge exists in the nf namespace with [`ROOT_ADDR`].
    pub(crate) fn bridge_ok(&self, exec: &mut dyn Exec) -> Result<bool, LabError> {
        let want = format!("{ROOT_ADDR}/24");
        Ok(Lab::brief_addr(exec, &self.nf_ns(), CLUSTER_BRIDGE)?
            .is_some_and(|(_, addrs)| addrs.contains(&want)))
    }

    /// Whether instance `k`'s interface is up with its address.
    pub(crate) fn instance_ok(&self, exec: &mut dyn Exec, k: u32) -> Result<bool, LabError> {
        let want = format!("{}/24", instance_addr(k));
        Ok(Lab::brief_addr(exec, &self.instance_ns(k), INSTANCE_IF)?
            .is_some_and(|(state, addrs)| state == "UP" && addrs.contains(&want)))
    }

    /// Makes the instance namespaces match [`Lab::instances`] (the lab's three namespaces
    /// exist), on the kind of cluster network [`Lab::routed`] asks for; whether anything was
    /// made or removed.
    pub(crate) fn reconcile_instances(
        &self,
        exec: &mut dyn Exec,
        present: &[String],
    ) -> Result<bool, LabError> {
        let n = self.instances;
        let found: Vec<(u64, String)> = present
            .iter()
            .filter_map(|ns| self.instance_index(ns).map(|k| (k, ns.clone())))
            .collect();
        let nf = self.nf_ns();
        let rt = self.cluster_router_ns();
        let routed_present = present.iter().any(|ns| self.routed_index(ns));
        let routed = self.routed;
        // The peer's end of the veth first: deleting a namespace destroys its links
        // asynchronously, and an instance made again at once would find `fs-cl{k}` (or the
        // router's `rt-i{k}`) still there.
        let del = |exec: &mut dyn Exec, k: u64, ns: &str| -> Result<(), LabError> {
            if let Ok(k) = u32::try_from(k) {
                exec.run(
                    &Cmd::new(&["ip", "-n", &nf, "link", "del", &instance_port(k)]).may_fail(),
                )?;
                if routed && (1..=MAX_INSTANCES).contains(&k) {
                    let port = crate::RoutedHost::Instance(k).router_port();
                    exec.run(&Cmd::new(&["ip", "-n", &rt, "link", "del", &port]).may_fail())?;
                }
            }
            exec.run(&Cmd::new(&["ip", "netns", "del", ns]).may_fail())?;
            Ok(())
        };
        let del_bridge =
            Cmd::new(&["ip", "-n", &self.nf_ns(), "link", "del", CLUSTER_BRIDGE]).may_fail();
        let mut made = false;
        if routed_present && !routed {
            // A routed network where a bridged one (or none) is asked for.
            for cmd in self.routed_down_plan() {
                exec.run(&cmd)?;
            }
            made = true;
        }
        if n == 0 {
            if found.is_empty() {
                return Ok(made);
            }
            for (k, ns) in &found {
                del(exec, *k, ns)?;
            }
            exec.run(&del_bridge)?;
            return Ok(true);
        }
        let mut keep: Vec<u32> = Vec::new();
        let net_ok = if routed {
            routed_present && self.routed_ok(exec)?
        } else {
            self.bridge_ok(exec)?
        };
        if net_ok {
            for (k, _) in &found {
                if let Ok(k) = u32::try_from(*k) {
                    if (1..=n).contains(&k)
                        && (if routed {
                            self.routed_instance_ok(exec, k)?
                        } else {
                            self.instance_ok(exec, k)?
                        })
                    {
                        keep.push(k);
                    }
                }
            }
        } else {
            // A new network: every instance is joined to it anew.
            if routed {
                // (A bridge of a lab made without --routed goes too.)
                for cmd in self.routed_down_plan() {
                    exec.run(&cmd)?;
                }
            }
            exec.run(&del_bridge)?;
            for cmd in self.cluster_plan() {
                exec.run(&cmd)?;
            }
            made = true;
        }
        for (k, ns) in &found {
            if !u32::try_from(*k).is_ok_and(|k| keep.contains(&k)) {
                del(exec, *k, ns)?;
                made = true;
            }
        }
        for k in 1..=n {
            if !keep.contains(&k) {
                for cmd in self.instance_plan(k) {
                    exec.run(&cmd)?;
                }
                made = true;
            }
        }
        Ok(made)
    }

    /// The cluster lines of [`Lab::describe`] (empty without instances).
    pub(crate) fn describe_instances(&self) -> String {
        if self.instances == 0 {
            return String::new();
        }
        if self.routed {
            return self.describe_routed();
        }
        let list: Vec<String> = (1..=self.instances)
            .map(|k| format!("{} {}", self.instance_ns(k), instance_addr(k)))
            .collect();
        format!(
            "cluster     {CLUSTER_NET} on bridge {CLUSTER_BRIDGE} in {}: root, controller, store at {ROOT_ADDR} (not routed to client or server)\n\
             instances   {} (each on {INSTANCE_IF}; its peer {CLUSTER_BRIDGE}{{k}} in {})\n",
            self.nf_ns(),
            list.join(", "),
            self.nf_ns(),
        )
    }
}

/// Parses `ip -br addr` output: (device without `@peer`, state, addresses).
pub(crate) fn parse_brief(out: &str) -> Vec<(String, String, Vec<String>)> {
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let dev = it.next()?.split('@').next()?.to_owned();
            let state = it.next()?.to_owned();
            Some((dev, state, it.map(str::to_owned).collect()))
        })
        .collect()
}

/// A Python script for a host on the cluster network that holds no key, at address `own`:
/// it sends every kind of datagram the roles take (a Report for a made-up instance 9, a Lag,
/// Assignments, Claims and Releases with the largest epoch to `instance`, Data with and
/// without a plausible clock, notices), each bare and with a made-up trailer, three rounds
/// 200 ms apart, and prints how many it sent. Per round the controller gets 2 kinds, the root
/// 5 and `instance` 33, each twice; none may be taken.
pub fn forger(own: Ipv4Addr, instance: Ipv4Addr) -> String {
    include_str!("forger.py")
        .replace("{ROOT}", &ROOT_ADDR.to_string())
        .replace("{I1}", &instance.to_string())
        .replace("{I}", &own.to_string())
        .replace("{SERVER}", &crate::SERVER.to_string())
}
