//! Linux's own HA NAT in the lab (`flowstate lab up --kernel-ha`): the peer flowstate's
//! failover is measured against.
//!
//! ```text
//!  client ns              nf ns: only a switch              r1 ns (primary), r2 ns (backup)
//!  fs-c 10.0.0.2/24 ──┐                                     fs-ri 10.0.0.25{2,3}/24 (+VIP 10.0.0.1)
//!   default via       └ fs-in ─ bridge fs-ib ─ fs-r1i, fs-r2i ── fs-ri
//!   10.0.0.1                                                 fs-ro 198.51.100.25{2,3}/24
//!  server ns              ┌ fs-out ─ bridge fs-ob ─ fs-r1o, fs-r2o ── fs-ro  (+VIP 198.51.100.1)
//!  fs-s 198.51.100.2,.3 ──┘                                  fs-rs 198.18.0.{1,2}/24: r1 <-veth-> r2
//!   10.0.0.0/24 via 198.51.100.1                              (conntrackd's dedicated link)
//! ```
//!
//! * The client and server namespaces, their addresses, routes and servers are those of the
//!   ordinary lab; the nf namespace keeps its ports `fs-in`/`fs-out` but enslaves them to two
//!   bridges, each also holding one port per router. The nf namespace itself has no address
//!   there and forwards nothing (`ip_forward=0`): it is a switch, and nothing else may run on
//!   its ports meanwhile (no flowstate, no [`Lab::kernel_nat`]; switching either on switches
//!   this off).
//! * Each router: IPv4 forwarding, nftables ([`HA_NAT_TABLE`]) that SNATs the inside network to
//!   [`BOX_OUTSIDE`] (SNAT, not masquerade: masquerade would take the router's own address
//!   198.51.100.25x and drop its mappings when an address goes away) and forwards only new
//!   connections from the inside and packets conntrack already knows, so that the backup
//!   carries an existing connection only once conntrackd has committed its state.
//! * keepalived (VRRPv3, advertisements every [`HA_ADVERT_INT_MS`] ms, one sync group of two
//!   instances: `inside` on `fs-ri` holding [`BOX_INSIDE`], `outside` on `fs-ro` holding
//!   [`BOX_OUTSIDE`]); r1 has priority 150 and starts as master, r2 100. On each transition
//!   keepalived runs `notify.sh` (the lab's own copy of conntrackd's `primary-backup.sh`):
//!   master: `conntrackd -c; -f; -R; -B`; backup: `-s` (check), `-t; -n`; fault: `-t`.
//! * conntrackd in FTFW mode, UDP over `fs-rs` (port [`HA_SYNC_PORT`]), syncing TCP, UDP and
//!   ICMP entries, with an external cache that the new master commits.
//! * Every file of theirs is under `{state}/ha`: `nft.conf`, `notify.sh`, `pids`, and per router
//!   `r{1,2}/`: `keepalived.conf`, `keepalived.log` (its console log), `keepalived.pid`,
//!   `vrrp.pid`, `conntrackd.conf`, `conntrackd.log`, `conntrackd.out`, `conntrackd.ctl` (its
//!   UNIX socket), `conntrackd.lock`, `notify.log` (each transition and each conntrackd call).
//!   Nothing uses the system's `/etc`, `/var/run` or `/var/lock` defaults, so several labs (and
//!   the two routers of one) run side by side.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{
    Cmd, Exec, Lab, LabError, BOX_INSIDE, BOX_OUTSIDE, CLIENT_IF, INSIDE_NET, NF_INSIDE_IF,
    NF_OUTSIDE_IF, SERVER, SERVER_IF,
};

/// The bridge in the nf namespace joining the client (`fs-in`) and the routers' inside ports.
pub const HA_INSIDE_BRIDGE: &str = "fs-ib";
/// The bridge in the nf namespace joining the server (`fs-out`) and the routers' outside ports.
pub const HA_OUTSIDE_BRIDGE: &str = "fs-ob";
/// A router's inside interface (in its namespace).
pub const HA_INSIDE_IF: &str = "fs-ri";
/// A router's outside interface (in its namespace).
pub const HA_OUTSIDE_IF: &str = "fs-ro";
/// A router's end of the dedicated link to the other router (conntrackd's sync traffic).
pub const HA_SYNC_IF: &str = "fs-rs";
/// The dedicated link's network.
pub const HA_SYNC_NET: &str = "198.18.0.0/24";
/// conntrackd's UDP port on the dedicated link.
pub const HA_SYNC_PORT: u16 = 3780;
/// The nftables table of each router.
pub const HA_NAT_TABLE: &str = "fs_ha";
/// keepalived's advertisement interval (VRRPv3): the backup takes over after about three of
/// them (plus its skew, 0.6 of one) without an advertisement.
pub const HA_ADVERT_INT_MS: u32 = 100;

/// One of the two routers of kernel HA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaRouter {
    /// 1 (the primary) or 2 (the backup): its namespace is `{prefix}r{index}`.
    pub index: u32,
    /// Its own address on the inside (besides the VIP [`BOX_INSIDE`] when master).
    pub inside: Ipv4Addr,
    /// Its own address on the outside (besides the VIP [`BOX_OUTSIDE`] when master).
    pub outside: Ipv4Addr,
    /// Its address on the dedicated link.
    pub sync: Ipv4Addr,
    /// Its VRRP priority.
    pub priority: u8,
}

/// The primary (r1) and the backup (r2).
pub const HA_ROUTERS: [HaRouter; 2] = [
    HaRouter {
        index: 1,
        inside: Ipv4Addr::new(10, 0, 0, 252),
        outside: Ipv4Addr::new(198, 51, 100, 252),
        sync: Ipv4Addr::new(198, 18, 0, 1),
        priority: 150,
    },
    HaRouter {
        index: 2,
        inside: Ipv4Addr::new(10, 0, 0, 253),
        outside: Ipv4Addr::new(198, 51, 100, 253),
        sync: Ipv4Addr::new(198, 18, 0, 2),
        priority: 100,
    },
];

/// A daemon of kernel HA (conntrackd or keepalived of one router).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// `conntrackd-r1`, `keepalived-r2`, ...
    pub name: String,
    /// An argument of its command line that tells it from other processes (its config file).
    pub marker: String,
    /// The command (in its router's namespace).
    pub cmd: Cmd,
}

/// A fast ping loop from the client to the server ([`Lab::start_gap_probe`]).
#[derive(Debug)]
pub struct GapProbe {
    pid: u32,
    log: PathBuf,
    duration: Duration,
}

fn other(r: &HaRouter) -> &'static HaRouter {
    &HA_ROUTERS[if r.index == 1 { 1 } else { 0 }]
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LabError {
    let path = path.to_owned();
    move |source| LabError::Io { path, source }
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Lab {
    /// Router `r`'s namespace (`{prefix}r1`: the primary, `{prefix}r2`: the backup).
    pub fn router_ns(&self, r: u32) -> String {
        format!("{}r{r}", self.prefix)
    }

    /// `r` if `ns` is one of this lab's router namespaces.
    pub(crate) fn router_index(&self, ns: &str) -> Option<u32> {
        HA_ROUTERS
            .iter()
            .map(|r| r.index)
            .find(|&i| self.router_ns(i) == ns)
    }

    /// The directory of kernel HA's files.
    pub fn ha_dir(&self) -> PathBuf {
        self.state_dir.join("ha")
    }

    /// Router `r`'s directory (configs, logs, pid files, conntrackd's socket and lock).
    pub fn ha_router_dir(&self, r: u32) -> PathBuf {
        self.ha_dir().join(format!("r{r}"))
    }

    fn ha_pid_file(&self) -> PathBuf {
        self.ha_dir().join("pids")
    }

    /// The nf namespace's port towards router `r` on the inside (`out`: the outside).
    fn router_port(r: u32, out: bool) -> String {
        format!("fs-r{r}{}", if out { 'o' } else { 'i' })
    }

    /// The commands that make kernel HA's namespaces, links, addresses and nftables rules (the
    /// lab is up; the files of [`Lab::kernel_ha_files`] are written).
    pub fn kernel_ha_plan(&self) -> Vec<Cmd> {
        let n = self.nf_ns();
        let nft_conf = self.ha_dir().join("nft.conf");
        let mut p = Vec::new();
        for r in &HA_ROUTERS {
            p.push(Cmd::new(&["ip", "netns", "add", &self.router_ns(r.index)]));
        }
        for br in [HA_INSIDE_BRIDGE, HA_OUTSIDE_BRIDGE] {
            p.push(Cmd::new(&[
                "ip",
                "-n",
                &n,
                "link",
                "add",
                br,
                "type",
                "bridge",
                "forward_delay",
                "0",
                "mcast_snooping",
                "0",
            ]));
        }
        for r in &HA_ROUTERS {
            let ns = self.router_ns(r.index);
            for (dev, out) in [(HA_INSIDE_IF, false), (HA_OUTSIDE_IF, true)] {
                p.push(Cmd::new(&[
                    "ip",
                    "link",
                    "add",
                    dev,
                    "netns",
                    &ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &Lab::router_port(r.index, out),
                    "netns",
                    &n,
                ]));
            }
        }
        let (r1, r2) = (self.router_ns(1), self.router_ns(2));
        p.push(Cmd::new(&[
            "ip", "link", "add", HA_SYNC_IF, "netns", &r1, "type", "veth", "peer", "name",
            HA_SYNC_IF, "netns", &r2,
        ]));
        let sysctl = |ns: &str, kv: &str| Cmd::new(&Lab::in_ns(ns, &["sysctl", "-qw", kv]));
        let ethtool_off = |ns: &str, dev: &str| {
            Cmd::new(&Lab::in_ns(
                ns,
                &["ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "off"],
            ))
        };
        for r in &HA_ROUTERS {
            let ns = self.router_ns(r.index);
            p.push(sysctl(&ns, "net.ipv6.conf.all.disable_ipv6=1").may_fail());
            p.push(sysctl(&ns, "net.ipv6.conf.default.disable_ipv6=1").may_fail());
            p.push(sysctl(&ns, "net.ipv4.ip_forward=1"));
            p.push(Cmd::new(&["ip", "-n", &ns, "link", "set", "lo", "up"]));
            for dev in [HA_INSIDE_IF, HA_OUTSIDE_IF, HA_SYNC_IF] {
                p.push(ethtool_off(&ns, dev));
            }
        }
        let mut ports: Vec<(String, &str)> = vec![
            (NF_INSIDE_IF.to_owned(), HA_INSIDE_BRIDGE),
            (NF_OUTSIDE_IF.to_owned(), HA_OUTSIDE_BRIDGE),
        ];
        for r in &HA_ROUTERS {
            ports.push((Lab::router_port(r.index, false), HA_INSIDE_BRIDGE));
            ports.push((Lab::router_port(r.index, true), HA_OUTSIDE_BRIDGE));
        }
        for br in [HA_INSIDE_BRIDGE, HA_OUTSIDE_BRIDGE] {
            p.push(ethtool_off(&n, br));
        }
        for (port, br) in &ports {
            p.push(ethtool_off(&n, port));
            p.push(Cmd::new(&[
                "ip", "-n", &n, "link", "set", port, "master", br,
            ]));
            p.push(Cmd::new(&["ip", "-n", &n, "link", "set", port, "up"]));
        }
        for br in [HA_INSIDE_BRIDGE, HA_OUTSIDE_BRIDGE] {
            p.push(Cmd::new(&["ip", "-n", &n, "link", "set", br, "up"]));
        }
        for r in &HA_ROUTERS {
            let ns = self.router_ns(r.index);
            for (addr, dev) in [
                (r.inside, HA_INSIDE_IF),
                (r.outside, HA_OUTSIDE_IF),
                (r.sync, HA_SYNC_IF),
            ] {
                p.push(Cmd::new(&[
                    "ip",
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    dev,
                ]));
                p.push(Cmd::new(&["ip", "-n", &ns, "link", "set", dev, "up"]));
            }
            p.push(Cmd::new(&Lab::in_ns(
                &ns,
                &["nft", "-f", &nft_conf.to_string_lossy()],
            )));
        }
        p
    }

    /// The files kernel HA runs from: (path, contents, executable).
    pub fn kernel_ha_files(&self) -> Vec<(PathBuf, String, bool)> {
        let dir = self.ha_dir();
        let mut v = vec![
            (dir.join("nft.conf"), nft_conf(), false),
            (dir.join("notify.sh"), NOTIFY_SH.to_owned(), true),
        ];
        for r in &HA_ROUTERS {
            let rd = self.ha_router_dir(r.index);
            v.push((rd.join("conntrackd.conf"), self.conntrackd_conf(r), false));
            v.push((rd.join("keepalived.conf"), self.keepalived_conf(r), false));
        }
        v
    }

    fn conntrackd_conf(&self, r: &HaRouter) -> String {
        let rd = self.ha_router_dir(r.index);
        let path = |f: &str| rd.join(f).to_string_lossy().into_owned();
        let mut ignore = String::new();
        for a in [Ipv4Addr::LOCALHOST, BOX_INSIDE, BOX_OUTSIDE] {
            let _ = writeln!(ignore, "            IPv4_address {a}");
        }
        for x in &HA_ROUTERS {
            for a in [x.inside, x.outside, x.sync] {
                let _ = writeln!(ignore, "            IPv4_address {a}");
            }
        }
        format!(
            "# conntrackd of router r{idx} in flowstate's lab {prefix}: FTFW over the dedicated link.\n\
             Sync {{\n\
             \x20   Mode FTFW {{\n\
             \x20       DisableExternalCache Off\n\
             \x20   }}\n\
             \x20   UDP {{\n\
             \x20       IPv4_address {me}\n\
             \x20       IPv4_Destination_Address {peer}\n\
             \x20       Port {HA_SYNC_PORT}\n\
             \x20       Interface {HA_SYNC_IF}\n\
             \x20       SndSocketBuffer 1249280\n\
             \x20       RcvSocketBuffer 1249280\n\
             \x20       Checksum on\n\
             \x20   }}\n\
             }}\n\
             General {{\n\
             \x20   HashSize 8192\n\
             \x20   HashLimit 65536\n\
             \x20   Syslog off\n\
             \x20   LogFile {log}\n\
             \x20   LockFile {lock}\n\
             \x20   UNIX {{\n\
             \x20       Path {ctl}\n\
             \x20   }}\n\
             \x20   NetlinkBufferSize 2097152\n\
             \x20   NetlinkBufferSizeMaxGrowth 8388608\n\
             \x20   Filter From Userspace {{\n\
             \x20       Protocol Accept {{\n\
             \x20           TCP\n\
             \x20           UDP\n\
             \x20           ICMP\n\
             \x20       }}\n\
             \x20       # The routers' own traffic (VRRP, sync, pings of the gateway) is not synced.\n\
             \x20       Address Ignore {{\n\
             {ignore}\
             \x20       }}\n\
             \x20   }}\n\
             }}\n",
            idx = r.index,
            prefix = self.prefix,
            me = r.sync,
            peer = other(r).sync,
            log = path("conntrackd.log"),
            lock = path("conntrackd.lock"),
            ctl = path("conntrackd.ctl"),
        )
    }

    fn keepalived_conf(&self, r: &HaRouter) -> String {
        let rd = self.ha_router_dir(r.index);
        let notify = |what: &str| {
            format!(
                "\"{} {} {} {what}\"",
                self.ha_dir().join("notify.sh").display(),
                rd.join("conntrackd.conf").display(),
                rd.join("notify.log").display(),
            )
        };
        let state = if r.index == 1 { "MASTER" } else { "BACKUP" };
        let advert = f64::from(HA_ADVERT_INT_MS) / 1000.0;
        let mut s = format!(
            "# keepalived of router r{idx} in flowstate's lab {prefix}: VRRP for Linux's HA NAT.\n\
             global_defs {{\n\
             \x20   router_id {prefix}r{idx}\n\
             \x20   script_user root\n\
             \x20   vrrp_version 3\n\
             \x20   vrrp_garp_master_delay 1\n\
             \x20   vrrp_garp_master_repeat 3\n\
             }}\n\
             vrrp_sync_group fs_ha {{\n\
             \x20   group {{\n\
             \x20       inside\n\
             \x20       outside\n\
             \x20   }}\n\
             \x20   notify_master {master}\n\
             \x20   notify_backup {backup}\n\
             \x20   notify_fault {fault}\n\
             }}\n",
            idx = r.index,
            prefix = self.prefix,
            master = notify("primary"),
            backup = notify("backup"),
            fault = notify("fault"),
        );
        for (name, dev, vrid, vip) in [
            ("inside", HA_INSIDE_IF, 51, BOX_INSIDE),
            ("outside", HA_OUTSIDE_IF, 52, BOX_OUTSIDE),
        ] {
            let _ = write!(
                s,
                "vrrp_instance {name} {{\n\
                 \x20   state {state}\n\
                 \x20   interface {dev}\n\
                 \x20   virtual_router_id {vrid}\n\
                 \x20   priority {prio}\n\
                 \x20   advert_int {advert}\n\
                 \x20   virtual_ipaddress {{\n\
                 \x20       {vip}/24 dev {dev}\n\
                 \x20   }}\n\
                 }}\n",
                prio = r.priority,
            );
        }
        s
    }

    /// The daemons kernel HA runs: conntrackd of r1 and r2, then keepalived of r1 and r2 (each
    /// in the foreground, with its config, pid files and logs in its router's directory).
    pub fn kernel_ha_daemons(&self) -> Vec<Daemon> {
        let mut v = Vec::new();
        for r in &HA_ROUTERS {
            let conf = self.ha_router_dir(r.index).join("conntrackd.conf");
            let conf = conf.to_string_lossy();
            v.push(Daemon {
                name: format!("conntrackd-r{}", r.index),
                marker: conf.to_string(),
                cmd: Cmd::new(&Lab::in_ns(
                    &self.router_ns(r.index),
                    &["conntrackd", "-C", &conf],
                )),
            });
        }
        for r in &HA_ROUTERS {
            let rd = self.ha_router_dir(r.index);
            let conf = rd.join("keepalived.conf").to_string_lossy().into_owned();
            let pid = rd.join("keepalived.pid").to_string_lossy().into_owned();
            let vrrp_pid = rd.join("vrrp.pid").to_string_lossy().into_owned();
            v.push(Daemon {
                name: format!("keepalived-r{}", r.index),
                marker: conf.clone(),
                cmd: Cmd::new(&Lab::in_ns(
                    &self.router_ns(r.index),
                    &[
                        "keepalived",
                        "--dont-fork",
                        "--log-console",
                        "--no-syslog",
                        "--log-detail",
                        "--vrrp",
                        "--use-file",
                        &conf,
                        "--pid",
                        &pid,
                        "--vrrp_pid",
                        &vrrp_pid,
                    ],
                )),
            });
        }
        v
    }

    /// The kernel-HA daemons that run: (name, pid).
    pub(crate) fn running_ha_daemons(&self, exec: &mut dyn Exec) -> Vec<(String, u32)> {
        let Ok(text) = std::fs::read_to_string(self.ha_pid_file()) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let name = it.next()?.to_owned();
                let pid: u32 = it.next()?.parse().ok()?;
                let marker = it.next()?;
                exec.alive(pid, marker).then_some((name, pid))
            })
            .collect()
    }

    /// Whether both routers exist and all four daemons run.
    pub(crate) fn ha_complete(&self, present: &[String], daemons: &[(String, u32)]) -> bool {
        HA_ROUTERS
            .iter()
            .all(|r| present.contains(&self.router_ns(r.index)))
            && self
                .kernel_ha_daemons()
                .iter()
                .all(|d| daemons.iter().any(|(n, _)| *n == d.name))
    }

    /// Kills (SIGKILL) every process in namespace `ns`, at once.
    pub(crate) fn kill_all_in(exec: &mut dyn Exec, ns: &str) -> Result<(), LabError> {
        let pids = Lab::ns_pids(exec, ns)?;
        if !pids.is_empty() {
            let mut argv = vec!["kill".to_owned(), "-KILL".into()];
            argv.extend(pids);
            exec.run(&Cmd {
                argv,
                may_fail: true,
            })?;
        }
        Ok(())
    }

    pub(crate) fn ns_pids(exec: &mut dyn Exec, ns: &str) -> Result<Vec<String>, LabError> {
        let out = exec.run(&Cmd::new(&["ip", "netns", "pids", ns]).may_fail())?;
        Ok(out
            .split_whitespace()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_owned)
            .collect())
    }

    /// Stops the kernel-HA daemons (and anything else left in the router namespaces).
    pub(crate) fn stop_ha_daemons(&self, exec: &mut dyn Exec) -> Result<(), LabError> {
        for (_, pid) in self.running_ha_daemons(exec) {
            exec.kill(pid);
        }
        let routers: Vec<String> = self
            .present(exec)?
            .into_iter()
            .filter(|ns| self.router_index(ns).is_some())
            .collect();
        for ns in routers {
            Lab::kill_all_in(exec, &ns)?;
        }
        Ok(())
    }

    /// Switches Linux's own HA NAT on or off (see the `ha` module docs and
    /// [`Lab::describe_kernel_ha`]). The lab must be up. On: a complete kernel HA is left as
    /// it is; otherwise (none, a partial one, or one whose primary was killed) it is removed
    /// and made anew, [`Lab::kernel_nat`] is switched off first, and this returns once r1
    /// holds the addresses, r2 is its backup and the client reaches the server. Off: the
    /// routers, their daemons, the bridges and `{state}/ha` are removed, the client's and
    /// server's ARP caches flushed, and the lab is the ordinary lab again. On failure nothing
    /// of kernel HA is left.
    pub fn kernel_ha(&self, exec: &mut dyn Exec, on: bool) -> Result<(), LabError> {
        if !on {
            return self.kernel_ha_off(exec);
        }
        let present = self.present(exec)?;
        let servers = self.running_servers(exec);
        if !self.base_complete(&present, &servers) {
            return Err(LabError::NotUp {
                prefix: self.prefix.clone(),
                what: "the lab",
                flag: "",
            });
        }
        let daemons = self.running_ha_daemons(exec);
        if self.ha_complete(&present, &daemons) {
            return Ok(());
        }
        self.kernel_ha_off(exec)?;
        // Either/or: Linux's plain NAT would put addresses on the bridge ports.
        for cmd in self.kernel_nat_plan(false) {
            exec.run(&cmd)?;
        }
        let made = self.ha_build(exec);
        if made.is_err() {
            let _ = self.kernel_ha_off(exec);
        }
        made
    }

    fn kernel_ha_off(&self, exec: &mut dyn Exec) -> Result<(), LabError> {
        let routers: Vec<String> = self
            .present(exec)?
            .into_iter()
            .filter(|ns| self.router_index(ns).is_some())
            .collect();
        let dir = self.ha_dir();
        if routers.is_empty() && !dir.exists() {
            return Ok(());
        }
        self.stop_ha_daemons(exec)?;
        let n = self.nf_ns();
        // The nf namespace's ends of the routers' veths first: deleting a namespace destroys
        // its links asynchronously, and kernel HA made again at once would find them there.
        for r in &HA_ROUTERS {
            for out in [false, true] {
                let port = Lab::router_port(r.index, out);
                exec.run(&Cmd::new(&["ip", "-n", &n, "link", "del", &port]).may_fail())?;
            }
        }
        for ns in &routers {
            exec.run(&Cmd::new(&["ip", "netns", "del", ns]).may_fail())?;
        }
        for br in [HA_INSIDE_BRIDGE, HA_OUTSIDE_BRIDGE] {
            exec.run(&Cmd::new(&["ip", "-n", &n, "link", "del", br]).may_fail())?;
        }
        // The client and server learnt a router's MAC for the box's addresses.
        for ns in [self.client_ns(), self.server_ns()] {
            exec.run(&Cmd::new(&["ip", "-n", &ns, "neigh", "flush", "all"]).may_fail())?;
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LabError::Io {
                path: dir,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    fn ha_build(&self, exec: &mut dyn Exec) -> Result<(), LabError> {
        use std::os::unix::fs::PermissionsExt;
        for r in &HA_ROUTERS {
            let rd = self.ha_router_dir(r.index);
            std::fs::create_dir_all(&rd).map_err(io_err(&rd))?;
        }
        for (path, text, executable) in self.kernel_ha_files() {
            std::fs::write(&path, text).map_err(io_err(&path))?;
            if executable {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .map_err(io_err(&path))?;
            }
        }
        for cmd in self.kernel_ha_plan() {
            exec.run(&cmd)?;
        }
        let mut pids = String::new();
        let pf = self.ha_pid_file();
        let daemons = self.kernel_ha_daemons();
        let wait = |what: &str, log: PathBuf, ok: &mut dyn FnMut() -> bool| {
            for _ in 0..100 {
                if ok() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(LabError::NotStarted {
                what: what.to_owned(),
                log,
            })
        };
        for (i, d) in daemons.iter().enumerate() {
            let r = if i % 2 == 0 { 1 } else { 2 };
            let rd = self.ha_router_dir(r);
            let file = if i < 2 {
                "conntrackd.out"
            } else {
                "keepalived.log"
            };
            let pid = exec.spawn(&d.cmd, &rd.join(file))?;
            let _ = writeln!(pids, "{} {} {}", d.name, pid, d.marker);
            std::fs::write(&pf, &pids).map_err(io_err(&pf))?;
            if i < 2 {
                // conntrackd is ready once it listens on its socket.
                let ctl = rd.join("conntrackd.ctl");
                wait(&d.name, rd.join("conntrackd.log"), &mut || ctl.exists())?;
            } else if r == 1 {
                // The primary takes the addresses before the backup starts.
                let r1 = self.router_ns(1);
                let mut master = || matches!(self.ha_master(exec), Ok(Some(ref m)) if *m == r1);
                wait(&d.name, rd.join("keepalived.log"), &mut master)?;
            } else {
                // The backup has run its notify script (conntrackd -t, -n).
                let log = rd.join("notify.log");
                let mut backup =
                    || std::fs::read_to_string(&log).is_ok_and(|t| t.contains("done backup"));
                wait(&d.name, rd.join("keepalived.log"), &mut backup)?;
            }
        }
        // The client reaches the server through the primary.
        let ping = Cmd::new(&Lab::in_ns(
            &self.client_ns(),
            &["ping", "-c1", "-W1", &SERVER.to_string()],
        ))
        .may_fail();
        for _ in 0..5 {
            if exec.run(&ping)?.contains(" 1 received") {
                return Ok(());
            }
        }
        Err(LabError::Ha {
            prefix: self.prefix.clone(),
            what: format!(
                "the client does not reach {SERVER} through {} (see {})",
                self.router_ns(1),
                self.ha_dir().display()
            ),
        })
    }

    /// Which router namespace holds the virtual addresses ([`BOX_INSIDE`] on `fs-ri` and
    /// [`BOX_OUTSIDE`] on `fs-ro`, both interfaces up) now: `None` if neither holds both (no
    /// kernel HA, or in the middle of a transition); an error if both do (split brain).
    pub fn ha_master(&self, exec: &mut dyn Exec) -> Result<Option<String>, LabError> {
        let mut holders = Vec::new();
        for r in &HA_ROUTERS {
            let ns = self.router_ns(r.index);
            let mut holds = true;
            for (dev, vip) in [(HA_INSIDE_IF, BOX_INSIDE), (HA_OUTSIDE_IF, BOX_OUTSIDE)] {
                let vip = vip.to_string();
                holds &= Lab::brief_addr(exec, &ns, dev)?.is_some_and(|(state, addrs)| {
                    state == "UP" && addrs.iter().any(|a| a.split('/').next() == Some(&vip))
                });
            }
            if holds {
                holders.push(ns);
            }
        }
        match holders.len() {
            0 | 1 => Ok(holders.pop()),
            _ => Err(LabError::Ha {
                prefix: self.prefix.clone(),
                what: format!("both {} hold the virtual addresses", holders.join(" and ")),
            }),
        }
    }

    /// Crashes the primary router r1 as a power cut would: every process in its namespace
    /// (keepalived, conntrackd, a notify script) is stopped at once (SIGSTOP, so none sends a
    /// last word such as VRRP's priority-0 advertisement), its links are taken down, and the
    /// processes are killed (SIGKILL). The backup's VRRP takes over after its master-down
    /// interval. [`Lab::kernel_ha`] on makes a new primary.
    pub fn kill_ha_primary(&self, exec: &mut dyn Exec) -> Result<(), LabError> {
        self.crash_primary(exec).map(|_| ())
    }

    /// [`Lab::kill_ha_primary`]; when the crash happened (just before the SIGSTOP).
    fn crash_primary(&self, exec: &mut dyn Exec) -> Result<SystemTime, LabError> {
        let ns = self.router_ns(1);
        if !self.present(exec)?.contains(&ns) {
            return Err(LabError::NotUp {
                prefix: self.prefix.clone(),
                what: "kernel HA",
                flag: " --kernel-ha",
            });
        }
        let pids = Lab::ns_pids(exec, &ns)?;
        let signal = |sig: &str| {
            let mut argv = vec!["kill".to_owned(), sig.to_owned()];
            argv.extend(pids.iter().cloned());
            Cmd {
                argv,
                may_fail: true,
            }
        };
        let at = SystemTime::now();
        if !pids.is_empty() {
            exec.run(&signal("-STOP"))?;
        }
        for dev in [HA_INSIDE_IF, HA_OUTSIDE_IF, HA_SYNC_IF] {
            exec.run(&Cmd::new(&["ip", "-n", &ns, "link", "set", dev, "down"]))?;
        }
        if !pids.is_empty() {
            exec.run(&signal("-KILL"))?;
        }
        Ok(at)
    }

    /// Starts a ping loop in the client namespace against the server for `duration` (whole
    /// seconds, at least 1), one echo every 5 ms asked (iputils' ping sends fewer than asked:
    /// about 120 a second on the 2-core CI machine, where `-i 0.01` gives only about 50), its
    /// output (`ping -D`: each reply with its receive time) in `{state}/gap-probe.log`.
    /// (Starting a second probe before the first one finished overwrites its log.)
    pub fn start_gap_probe(
        &self,
        exec: &mut dyn Exec,
        duration: Duration,
    ) -> Result<GapProbe, LabError> {
        let secs = duration.as_secs().max(1);
        let log = self.state_dir.join("gap-probe.log");
        let cmd = Cmd::new(&Lab::in_ns(
            &self.client_ns(),
            &[
                "ping",
                "-D",
                "-n",
                "-i",
                "0.005",
                "-w",
                &secs.to_string(),
                &SERVER.to_string(),
            ],
        ));
        let pid = exec.spawn(&cmd, &log)?;
        Ok(GapProbe {
            pid,
            log,
            duration: Duration::from_secs(secs),
        })
    }

    /// Measures Linux's HA NAT failover as a client sees it: makes kernel HA if it is not
    /// complete (so that a previous measurement's dead primary is replaced), pings the server
    /// from the client ([`Lab::start_gap_probe`], a reply every ~8 ms), crashes the primary after 1.5 s
    /// ([`Lab::kill_ha_primary`]) and returns the time from the crash to the first reply after
    /// the longest silence ([`failover_gap`]): the failover gap, to about 10 ms. Takes about
    /// 8 s (more if kernel HA is made); leaves the primary dead.
    pub fn peer_failover_gap(&self, exec: &mut dyn Exec) -> Result<Duration, LabError> {
        self.kernel_ha(exec, true)?;
        let probe = self.start_gap_probe(exec, Duration::from_secs(7))?;
        std::thread::sleep(Duration::from_millis(1500));
        let at = self.crash_primary(exec)?;
        let replies = probe.finish(exec)?;
        failover_gap(&replies, secs(at)).ok_or_else(|| LabError::Ha {
            prefix: self.prefix.clone(),
            what: format!(
                "no ping reply through the backup within the probe ({} replies in all)",
                replies.len()
            ),
        })
    }

    /// The kernel-HA lines of a description, for people.
    pub fn describe_kernel_ha(&self) -> String {
        let (r1, r2) = (HA_ROUTERS[0], HA_ROUTERS[1]);
        format!(
            "kernel ha   Linux's HA NAT between client and server: {} (primary) and {} (backup)\n\
             \x20           VRRPv3 (keepalived, every {HA_ADVERT_INT_MS} ms) moves {BOX_INSIDE} and {BOX_OUTSIDE}; nftables SNAT {INSIDE_NET} to {BOX_OUTSIDE}\n\
             \x20           conntrackd FTFW over {HA_SYNC_IF} ({} <-> {}, udp {HA_SYNC_PORT}); commit on takeover\n\
             \x20           r1 {} / {}, r2 {} / {} on {HA_INSIDE_IF} / {HA_OUTSIDE_IF}\n\
             \x20           {} is a switch: bridge {HA_INSIDE_BRIDGE} ({NF_INSIDE_IF}, fs-r1i, fs-r2i), {HA_OUTSIDE_BRIDGE} ({NF_OUTSIDE_IF}, fs-r1o, fs-r2o); client {CLIENT_IF}, server {SERVER_IF} as above\n\
             \x20           configs, logs, sockets: {}\n",
            self.router_ns(1),
            self.router_ns(2),
            r1.sync,
            r2.sync,
            r1.inside,
            r1.outside,
            r2.inside,
            r2.outside,
            self.nf_ns(),
            self.ha_dir().display(),
        )
    }
}

impl GapProbe {
    /// Waits for the ping loop to end; the receive times of its replies (seconds since the
    /// epoch, in order).
    pub fn finish(self, exec: &mut dyn Exec) -> Result<Vec<f64>, LabError> {
        let limit = self.duration + Duration::from_secs(5);
        let start = std::time::Instant::now();
        while exec.alive(self.pid, "ping") {
            if start.elapsed() > limit {
                exec.kill(self.pid);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&self.log).map_err(io_err(&self.log))?;
        Ok(ping_reply_times(&text))
    }
}

/// The receive times of the replies in `ping -D` output (`[1700000000.123456] 64 bytes from
/// ...`), in order.
pub fn ping_reply_times(out: &str) -> Vec<f64> {
    out.lines()
        .filter(|l| l.contains(" bytes from "))
        .filter_map(|l| {
            let ts = l.strip_prefix('[')?.split(']').next()?;
            ts.parse().ok()
        })
        .collect()
}

/// The failover gap in a probe's reply times (seconds) around a crash at `kill_at`: the time
/// from the crash to the reply that ends the longest silence after it. `None` if no reply came
/// before the crash or none after it.
pub fn failover_gap(replies: &[f64], kill_at: f64) -> Option<Duration> {
    let first_after = replies.iter().position(|&t| t > kill_at)?;
    if first_after == 0 {
        return None;
    }
    let end = (first_after..replies.len())
        .max_by(|&a, &b| {
            let (ga, gb) = (replies[a] - replies[a - 1], replies[b] - replies[b - 1]);
            ga.total_cmp(&gb)
        })
        .map(|i| replies[i])?;
    Some(Duration::from_secs_f64((end - kill_at).max(0.0)))
}

/// The nftables rules of each router.
fn nft_conf() -> String {
    format!(
        "# Linux's HA NAT in flowstate's lab (each router): SNAT of the inside network to the\n\
         # shared outside address, and forwarding of new connections from the inside and of what\n\
         # conntrack knows only (the backup carries an existing connection once conntrackd has\n\
         # committed it; before that its packets are dropped, never answered with a reset).\n\
         table ip {HA_NAT_TABLE} {{\n\
         \x20   chain postrouting {{\n\
         \x20       type nat hook postrouting priority srcnat; policy accept;\n\
         \x20       oifname \"{HA_OUTSIDE_IF}\" ip saddr {INSIDE_NET} snat to {BOX_OUTSIDE}\n\
         \x20   }}\n\
         \x20   chain forward {{\n\
         \x20       type filter hook forward priority filter; policy drop;\n\
         \x20       ct state established,related accept\n\
         \x20       iifname \"{HA_INSIDE_IF}\" oifname \"{HA_OUTSIDE_IF}\" ct state new tcp flags & (fin|syn|rst|ack) == syn accept\n\
         \x20       iifname \"{HA_INSIDE_IF}\" oifname \"{HA_OUTSIDE_IF}\" ct state new meta l4proto {{ udp, icmp }} accept\n\
         \x20   }}\n\
         \x20   chain input {{\n\
         \x20       type filter hook input priority filter; policy drop;\n\
         \x20       iif \"lo\" accept\n\
         \x20       ip protocol 112 accept\n\
         \x20       iifname \"{HA_SYNC_IF}\" accept\n\
         \x20       ct state established,related accept\n\
         \x20       icmp type echo-request accept\n\
         \x20   }}\n\
         }}\n"
    )
}

/// keepalived's notify script: conntrackd's `primary-backup.sh`, for one router's conntrackd.
const NOTIFY_SH: &str = r#"#!/bin/sh
# keepalived's notify script for Linux's HA NAT in flowstate's lab: what conntrackd's
# primary-backup.sh does on each VRRP transition, for one router's conntrackd (its own config,
# socket and lock file; no system defaults).
#   notify.sh CONNTRACKD_CONF LOG primary|backup|fault
PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
conf=$1
log=$2
what=$3
now() { date +%s.%N; }
ctd() {
    if ! conntrackd -C "$conf" "$@" >>"$log" 2>&1; then
        echo "$(now) ERROR: conntrackd $* failed" >>"$log"
    fi
}
echo "$(now) $what" >>"$log"
case "$what" in
primary)
    # Commit the external cache (what the other router synced) into the kernel table.
    # (conntrackd 1.4.7 leaves a commit that finished in one step marked as in progress: it
    # logs "ignoring flush command, commit still in progress" for the flush below, and would
    # skip a second commit by the same daemon. One failover per daemon is unaffected.)
    ctd -c
    ctd -f # flush the internal and external caches
    ctd -R # resync the internal cache with the kernel table
    ctd -B # send a bulk update to the backup
    ;;
backup)
    if ! conntrackd -C "$conf" -s >/dev/null 2>&1; then
        echo "$(now) WARNING: conntrackd does not answer on its socket" >>"$log"
    fi
    ctd -t # shorten the kernel's conntrack timers (zombie entries of a former master)
    ctd -n # request a resync from the master
    ;;
fault)
    ctd -t
    ;;
*)
    echo "$(now) ERROR: unknown state transition $what" >>"$log"
    exit 1
    ;;
esac
echo "$(now) done $what" >>"$log"
exit 0
"#;
