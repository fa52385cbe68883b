//! A network-namespace lab with real hosts on both sides of a flowstate box.
//!
//! ```text
//!  client ns                 nf ns (the box)                    server ns
//!  fs-c 10.0.0.2/24  <-veth->  fs-in | flowstate | fs-out  <-veth->  fs-s 198.51.100.2/24
//!  default via 10.0.0.1        (no addresses: flowstate           198.51.100.3/24 (backend b)
//!                               answers ARP for 10.0.0.1          10.0.0.0/24 via 198.51.100.1
//!                               and 198.51.100.1)                 http :8080 on .2 and .3
//!                                                                  iperf3 -s on .2
//! ```
//!
//! Promises:
//! * Every name the lab makes starts with its prefix (`fs-` by default): namespaces
//!   `{prefix}client`, `{prefix}nf`, `{prefix}server`, and a state directory
//!   `/run/flowstate-lab/{prefix}` with the servers' pids, logs and web roots. Interfaces live
//!   only inside those namespaces, so nothing is added to the caller's namespace.
//! * [`Lab::up`] is idempotent: a complete lab is left as it is; a partial one is removed and
//!   made again. [`Lab::down`] removes exactly what `up` made (the prefixed namespaces, the
//!   servers it started, its state directory) and nothing else; it succeeds when nothing is
//!   there.
//! * All traffic between client and server crosses the `nf` namespace: the client's default
//!   route and the server's route back to 10.0.0.0/24 point at the box's addresses, which no
//!   kernel owns (the box is whatever runs on `fs-in`/`fs-out`: flowstate, or Linux's own NAT
//!   with [`Lab::kernel_nat`]).
//! * Checksum and segmentation offloads are off on every lab interface, so a packet read from
//!   a port is complete (its checksums are correct) and at most one MTU long.
//! * The commands run through the [`Exec`] trait (`ip`, `ethtool`, `sysctl`, `nft`, the
//!   servers), so the plans are tested without privileges; [`System`] runs them for real.
//!
//! Two additions, each optional (the first with a variant):
//! * **Instance namespaces** ([`Lab::with_instances`], `flowstate lab up --instances N`): a
//!   cluster network [`CLUSTER_NET`] inside the nf namespace, where a bridge `fs-cl` holds
//!   [`ROOT_ADDR`] (the root, the controller and a managed store listen there), and N
//!   namespaces `{prefix}i{k}`, each joined to the bridge by a veth (`fs-cl{k}` in the nf
//!   namespace, `fs-i` with [`instance_addr`]`(k)` in the instance's). The nf namespace still
//!   forwards nothing: the instances reach 192.0.2.1 and each other, never the client or
//!   server side.
//!
//!   ```text
//!   nf ns: bridge fs-cl 192.0.2.1/24 ── fs-cl1 <-veth-> fs-i 192.0.2.11/24  ({prefix}i1)
//!                                     ── fs-cl2 <-veth-> fs-i 192.0.2.12/24  ({prefix}i2) ...
//!   ```
//!
//!   [`Lab::up`] reconciles the instances without touching the rest: a lab that is up with
//!   another count gets the missing instance namespaces added and the extra ones removed.
//!
//!   **Routed** ([`Lab::with_routed`], `flowstate lab up --instances N --routed`): no segment
//!   shared between roles. A router namespace `{prefix}rt` (`ip_forward=1`) has a link of its
//!   own, 10.200.K.0/30 (router .1, host .2, MTU 9000), to each host: the nf namespace
//!   ([`ROOT_ADDR`], K = 0), a store namespace `{prefix}st` ([`STORE_ADDR`], where a managed
//!   store listens; K = 100) and each instance namespace ([`instance_addr`]`(k)`, K = k). Each
//!   host holds its role's address as a /32 with `192.0.2.0/24 via` the router, the router a
//!   /32 route to each; reverse-path filters are off. GENEVE between the root and the
//!   instances is routed (see the `routed` module and [`RoutedHost`]).
//!
//!   ```text
//!   nf ns fs-rt 10.200.0.2/30 + 192.0.2.1/32  ──veth── rt-nf  ┐
//!   {prefix}st fs-st 10.200.100.2/30 + .5/32  ──veth── rt-st  ├ {prefix}rt: router
//!   {prefix}i{k} fs-i 10.200.k.2/30 + .(10+k)/32 ─veth─ rt-i{k} ┘  (/32 routes to each)
//!   ```
//! * **Linux's own HA NAT** ([`Lab::kernel_ha`], `flowstate lab up --kernel-ha`): the peer for
//!   failover. Two router namespaces `{prefix}r1` (primary) and `{prefix}r2` (backup) with
//!   nftables SNAT to [`BOX_OUTSIDE`], keepalived (VRRP) moving [`BOX_INSIDE`] and
//!   [`BOX_OUTSIDE`] between them, and conntrackd (FTFW) syncing the conntrack table over a
//!   dedicated link; the nf namespace becomes a plain switch (see the `ha` module's docs and
//!   [`Lab::describe_kernel_ha`]). [`Lab::kill_ha_primary`] crashes the primary,
//!   [`Lab::ha_master`] tells who holds the addresses, [`Lab::peer_failover_gap`] measures the
//!   gap a client sees.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cluster;
mod ecmp;
mod ha;
mod routed;

pub use cluster::{
    forger, instance_addr, instance_port, CLUSTER_BRIDGE, CLUSTER_BRIDGE_MAC, CLUSTER_MTU,
    CLUSTER_NET, INSTANCE_IF, MAX_INSTANCES, ROOT_ADDR,
};
pub use ecmp::{CLIENT2_IF, ROOT2_ADDR, SERVER2_IF};
pub use ha::{
    failover_gap, ping_reply_times, Daemon, GapProbe, HaRouter, HA_ADVERT_INT_MS, HA_INSIDE_BRIDGE,
    HA_INSIDE_IF, HA_NAT_TABLE, HA_OUTSIDE_BRIDGE, HA_OUTSIDE_IF, HA_ROUTERS, HA_SYNC_IF,
    HA_SYNC_NET, HA_SYNC_PORT,
};
pub use routed::{Cut, RoutedHost, NF_ROUTED_IF, ROUTED_LINKS, STORE_ADDR, STORE_IF};

/// The client's address.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The box's address on the inside (the client's gateway).
pub const BOX_INSIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The box's address on the outside (the NAT's external address; the server's route back).
pub const BOX_OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The server (backend `a`, iperf3).
pub const SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
/// The second backend (`b`), an address of the server namespace with its own HTTP server.
pub const SERVER2: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 3);
/// A virtual address for the load balancer (routed to the box by the client's default route).
pub const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// The inside prefix.
pub const INSIDE_NET: &str = "10.0.0.0/24";
/// The HTTP servers' port.
pub const HTTP_PORT: u16 = 8080;
/// The iperf3 server's port.
pub const IPERF_PORT: u16 = 5201;

/// The client's interface (in the client namespace).
pub const CLIENT_IF: &str = "fs-c";
/// The box's inside port (in the nf namespace).
pub const NF_INSIDE_IF: &str = "fs-in";
/// The box's outside port (in the nf namespace).
pub const NF_OUTSIDE_IF: &str = "fs-out";
/// The server's interface (in the server namespace).
pub const SERVER_IF: &str = "fs-s";

/// Where labs keep their state directories.
pub const STATE_ROOT: &str = "/run/flowstate-lab";

/// The nftables table [`Lab::kernel_nat`] adds in the nf namespace.
pub const KERNEL_NAT_TABLE: &str = "fs_nat";

/// Why a lab command failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A command could not be started (the tool is missing, or no permission).
    #[error("cannot run `{cmd}`: {source}{hint}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// A command ran and failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The lab's state directory could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The prefix is not usable in names.
    #[error("invalid lab prefix {0:?}: expected 1 to 24 of [a-z0-9-], starting with a letter")]
    Prefix(String),
    /// More instances than [`MAX_INSTANCES`] were asked for.
    #[error("{0} instances asked for: a lab has at most {MAX_INSTANCES}")]
    Instances(u32),
    /// A routed lab ([`Lab::with_routed`]) without instances.
    #[error("lab {0}: a routed cluster network needs instances (--instances N with --routed)")]
    RoutedWithoutInstances(String),
    /// The lab (or the part of it an operation needs) is not up.
    #[error("lab {prefix}: {what} is not up (run `flowstate lab up{flag}` first)")]
    NotUp {
        /// The lab's prefix.
        prefix: String,
        /// What is missing.
        what: &'static str,
        /// The `lab up` option that makes it.
        flag: &'static str,
    },
    /// Linux's HA NAT did not do what it should (no router took the addresses, both did, or
    /// traffic did not come back through the backup).
    #[error("kernel HA ({prefix}): {what}")]
    Ha {
        /// The lab's prefix.
        prefix: String,
        /// What went wrong.
        what: String,
    },
    /// A server the lab started did not come up.
    #[error("{what} did not start (see {log})")]
    NotStarted {
        /// Which server.
        what: String,
        /// Its log.
        log: PathBuf,
    },
}

/// A command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Whether a failure is expected and harmless (e.g. deleting what may not exist).
    pub may_fail: bool,
}

impl Cmd {
    fn new<S: AsRef<str>>(argv: &[S]) -> Cmd {
        Cmd {
            argv: argv.iter().map(|s| s.as_ref().to_owned()).collect(),
            may_fail: false,
        }
    }

    fn may_fail(mut self) -> Cmd {
        self.may_fail = true;
        self
    }

    /// The command as a shell would show it.
    pub fn line(&self) -> String {
        self.argv.join(" ")
    }
}

/// Runs commands: the one place where the lab touches the system.
pub trait Exec {
    /// Runs `cmd` to completion; its stdout, or an error with its stderr (unless
    /// `cmd.may_fail`, then the output so far and `Ok`).
    fn run(&mut self, cmd: &Cmd) -> Result<String, LabError>;
    /// Starts `cmd` in the background, its output going to `log`; returns its pid.
    fn spawn(&mut self, cmd: &Cmd, log: &Path) -> Result<u32, LabError>;
    /// Stops process `pid` (SIGTERM) if it still runs.
    fn kill(&mut self, pid: u32);
    /// Whether process `pid` runs and one of its arguments contains `marker` (so that a pid
    /// reused by another program is not taken for a lab server).
    fn alive(&mut self, pid: u32, marker: &str) -> bool;
}

/// [`Exec`] on the real system.
#[derive(Debug, Default)]
pub struct System {
    children: Vec<Child>,
}

fn hint_for(program: &str) -> &'static str {
    match program {
        "ip" => " (install iproute2: scripts/setup-live)",
        "ethtool" => " (install ethtool: scripts/setup-live)",
        "nft" => " (install nftables: scripts/setup-live)",
        "iperf3" => " (install iperf3: scripts/setup-live)",
        "keepalived" => " (install keepalived: scripts/setup-live)",
        "conntrackd" => " (install conntrackd: scripts/setup-live)",
        "ping" => " (install iputils-ping: scripts/setup-live)",
        _ => "",
    }
}

impl Exec for System {
    fn run(&mut self, cmd: &Cmd) -> Result<String, LabError> {
        let Some((program, args)) = cmd.argv.split_first() else {
            return Ok(String::new());
        };
        let out = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| LabError::Spawn {
                cmd: cmd.line(),
                source,
                hint: hint_for(program),
            })?;
        if !out.status.success() && !cmd.may_fail {
            let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            if stderr.contains("Operation not permitted") {
                stderr.push_str(" (the lab needs root: CAP_NET_ADMIN and CAP_SYS_ADMIN)");
            }
            return Err(LabError::Failed {
                cmd: cmd.line(),
                status: out.status.to_string(),
                stderr,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn spawn(&mut self, cmd: &Cmd, log: &Path) -> Result<u32, LabError> {
        use std::os::unix::process::CommandExt;
        let Some((program, args)) = cmd.argv.split_first() else {
            return Err(LabError::Failed {
                cmd: String::new(),
                status: "empty command".into(),
                stderr: String::new(),
            });
        };
        let file = std::fs::File::create(log).map_err(|source| LabError::Io {
            path: log.to_owned(),
            source,
        })?;
        let err = file.try_clone().map_err(|source| LabError::Io {
            path: log.to_owned(),
            source,
        })?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            // Its own process group: a Ctrl-C meant for the caller does not reach it.
            .process_group(0)
            .spawn()
            .map_err(|source| LabError::Spawn {
                cmd: cmd.line(),
                source,
                hint: hint_for(program),
            })?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    fn kill(&mut self, pid: u32) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.swap_remove(i);
            let _ = c.kill();
            let _ = c.wait();
            return;
        }
        let _ = Command::new("kill")
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
    }

    fn alive(&mut self, pid: u32, marker: &str) -> bool {
        if let Some(c) = self.children.iter_mut().find(|c| c.id() == pid) {
            if !matches!(c.try_wait(), Ok(None)) {
                return false;
            }
        }
        if !running(pid) {
            return false;
        }
        match std::fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(cmdline) => cmdline
                .split(|&b| b == 0)
                .any(|arg| String::from_utf8_lossy(arg).contains(marker)),
            Err(_) => false,
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        // Reap what has ended; what still runs belongs to the lab (stopped by `down`).
        for c in &mut self.children {
            let _ = c.try_wait();
        }
    }
}

/// A server the lab runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Short name (`http-a`, `http-b`, `iperf3`): its log is `{name}.log`.
    pub name: &'static str,
    /// A word of its command line that tells it from other processes.
    pub marker: &'static str,
    /// The command (run in the server namespace).
    pub cmd: Cmd,
}

/// One lab: its names, how many instance namespaces it has, and where it keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lab {
    prefix: String,
    state_dir: PathBuf,
    instances: u32,
    routed: bool,
}

/// What [`Lab::status`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The lab's namespaces that exist: the three of the lab, its instance namespaces and its
    /// kernel-HA routers.
    pub namespaces: Vec<String>,
    /// The lab's servers that run, and the kernel-HA daemons: (name, pid).
    pub servers: Vec<(String, u32)>,
    /// The instance namespaces that exist (`{prefix}i{k}`, by k), whatever count was asked.
    pub instances: Vec<String>,
    /// The kernel-HA router namespaces that exist (`{prefix}r1`, `{prefix}r2`).
    pub routers: Vec<String>,
    /// Whether the routed cluster network's router namespace (`{prefix}rt`) exists: the lab
    /// was made with [`Lab::with_routed`].
    pub routed: bool,
    /// Whether every namespace exists and every server runs, including instances 1 to
    /// [`Lab::instances`] with their links (routed ones with [`Lab::with_routed`], with the
    /// router and the store's namespace) and, when a router namespace exists, every
    /// kernel-HA daemon. (More instances than asked for do not make it incomplete; `up` trims
    /// them.)
    pub complete: bool,
}

impl Lab {
    /// The lab called `prefix` (every name it makes starts with it), state under
    /// [`STATE_ROOT`].
    pub fn new(prefix: &str) -> Result<Lab, LabError> {
        Lab::with_state_root(prefix, Path::new(STATE_ROOT))
    }

    /// The lab called `prefix` with its state directory under `root`.
    pub fn with_state_root(prefix: &str, root: &Path) -> Result<Lab, LabError> {
        let ok = (1..=24).contains(&prefix.len())
            && prefix.starts_with(|c: char| c.is_ascii_lowercase())
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok {
            return Err(LabError::Prefix(prefix.to_owned()));
        }
        Ok(Lab {
            prefix: prefix.to_owned(),
            state_dir: root.join(prefix),
            instances: 0,
            routed: false,
        })
    }

    /// The same lab with `n` instance namespaces (0, the default: none; at most
    /// [`MAX_INSTANCES`], else [`LabError::Instances`]).
    pub fn with_instances(mut self, n: u32) -> Result<Lab, LabError> {
        if n > MAX_INSTANCES {
            return Err(LabError::Instances(n));
        }
        self.instances = n;
        Ok(self)
    }

    /// How many instance namespaces this lab has.
    pub fn instances(&self) -> u32 {
        self.instances
    }

    /// The same lab with (`true`) or without (the default) a routed cluster network: the root's
    /// host (the nf namespace), a store namespace `{prefix}st` and each instance namespace on a
    /// link of its own to a router `{prefix}rt`, instead of one bridge (see the `routed`
    /// module). Needs instances ([`Lab::with_instances`]); [`Lab::up`] says so otherwise.
    pub fn with_routed(mut self, routed: bool) -> Lab {
        self.routed = routed;
        self
    }

    /// Whether this lab's cluster network is routed.
    pub fn routed(&self) -> bool {
        self.routed
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The client namespace.
    pub fn client_ns(&self) -> String {
        format!("{}client", self.prefix)
    }

    /// The box's namespace.
    pub fn nf_ns(&self) -> String {
        format!("{}nf", self.prefix)
    }

    /// The server namespace.
    pub fn server_ns(&self) -> String {
        format!("{}server", self.prefix)
    }

    /// The three namespaces of every lab, in the order they are made (instance and router
    /// namespaces come on top: [`Lab::instance_ns`], [`Lab::router_ns`]).
    pub fn namespaces(&self) -> [String; 3] {
        [self.client_ns(), self.nf_ns(), self.server_ns()]
    }

    /// The state directory (pids, logs, web roots).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The web root of backend `a` (198.51.100.2) or `b` (198.51.100.3).
    pub fn www(&self, backend: char) -> PathBuf {
        self.state_dir.join(format!("www-{backend}"))
    }

    /// The log of server `name` (`http-a`, `http-b`, `iperf3`).
    pub fn log(&self, name: &str) -> PathBuf {
        self.state_dir.join(format!("{name}.log"))
    }

    fn pid_file(&self) -> PathBuf {
        self.state_dir.join("pids")
    }

    /// `ip netns exec NS argv...`.
    pub fn in_ns(ns: &str, argv: &[&str]) -> Vec<String> {
        let mut v = vec![
            "ip".to_owned(),
            "netns".into(),
            "exec".into(),
            ns.to_owned(),
        ];
        v.extend(argv.iter().map(|s| (*s).to_owned()));
        v
    }

    /// The commands that build the namespaces, links, addresses and routes.
    pub fn up_plan(&self) -> Vec<Cmd> {
        let (c, n, s) = (self.client_ns(), self.nf_ns(), self.server_ns());
        let mut p = Vec::new();
        for ns in [&c, &n, &s] {
            p.push(Cmd::new(&["ip", "netns", "add", ns]));
        }
        // Each veth is made with both ends already in their namespaces.
        p.push(Cmd::new(&[
            "ip",
            "link",
            "add",
            CLIENT_IF,
            "netns",
            &c,
            "type",
            "veth",
            "peer",
            "name",
            NF_INSIDE_IF,
            "netns",
            &n,
        ]));
        p.push(Cmd::new(&[
            "ip",
            "link",
            "add",
            SERVER_IF,
            "netns",
            &s,
            "type",
            "veth",
            "peer",
            "name",
            NF_OUTSIDE_IF,
            "netns",
            &n,
        ]));
        let sysctl = |ns: &str, kv: &str| Cmd {
            argv: Lab::in_ns(ns, &["sysctl", "-qw", kv]),
            may_fail: false,
        };
        let ethtool_off = |ns: &str, dev: &str| Cmd {
            argv: Lab::in_ns(
                ns,
                &["ethtool", "-K", dev, "tx", "off", "rx", "off", "gro", "off"],
            ),
            may_fail: false,
        };
        for (ns, devs) in [
            (&c, &[CLIENT_IF][..]),
            (&n, &[NF_INSIDE_IF, NF_OUTSIDE_IF][..]),
            (&s, &[SERVER_IF][..]),
        ] {
            // IPv4 only: no router solicitations or DAD chatter through the box.
            // (A kernel without IPv6 has no such keys: nothing to turn off.)
            p.push(sysctl(ns, "net.ipv6.conf.all.disable_ipv6=1").may_fail());
            p.push(sysctl(ns, "net.ipv6.conf.default.disable_ipv6=1").may_fail());
            p.push(Cmd::new(&["ip", "-n", ns, "link", "set", "lo", "up"]));
            for dev in devs {
                p.push(ethtool_off(ns, dev));
                p.push(Cmd::new(&["ip", "-n", ns, "link", "set", dev, "up"]));
            }
        }
        // The box forwards nothing by itself: flowstate (or kernel_nat) is the box.
        p.push(sysctl(&n, "net.ipv4.ip_forward=0"));
        let cidr = |a: Ipv4Addr| format!("{a}/24");
        p.push(Cmd::new(&[
            "ip",
            "-n",
            &c,
            "addr",
            "add",
            &cidr(CLIENT),
            "dev",
            CLIENT_IF,
        ]));
        p.push(Cmd::new(&[
            "ip",
            "-n",
            &c,
            "route",
            "add",
            "default",
            "via",
            &BOX_INSIDE.to_string(),
        ]));
        for a in [SERVER, SERVER2] {
            p.push(Cmd::new(&[
                "ip",
                "-n",
                &s,
                "addr",
                "add",
                &cidr(a),
                "dev",
                SERVER_IF,
            ]));
        }
        p.push(Cmd::new(&[
            "ip",
            "-n",
            &s,
            "route",
            "add",
            INSIDE_NET,
            "via",
            &BOX_OUTSIDE.to_string(),
        ]));
        p
    }

    /// The servers `up` starts in the server namespace: an HTTP server on each backend
    /// address (python3's http.server, which logs every request with the peer's address),
    /// and iperf3 on the first.
    pub fn servers(&self) -> Vec<Server> {
        let s = self.server_ns();
        let mut v = Vec::new();
        for (name, addr, b) in [("http-a", SERVER, 'a'), ("http-b", SERVER2, 'b')] {
            let www = self.www(b);
            let argv = Lab::in_ns(
                &s,
                &[
                    "python3",
                    "-u",
                    "-m",
                    "http.server",
                    &HTTP_PORT.to_string(),
                    "--bind",
                    &addr.to_string(),
                    "--directory",
                    &www.to_string_lossy(),
                ],
            );
            v.push(Server {
                name,
                marker: "http.server",
                cmd: Cmd {
                    argv,
                    may_fail: false,
                },
            });
        }
        v.push(Server {
            name: "iperf3",
            marker: "iperf3",
            cmd: Cmd {
                argv: Lab::in_ns(
                    &s,
                    &[
                        "iperf3",
                        "-s",
                        "-B",
                        &SERVER.to_string(),
                        "-p",
                        &IPERF_PORT.to_string(),
                    ],
                ),
                may_fail: false,
            },
        });
        v
    }

    /// The commands that remove the namespaces in `present` (those of this lab only: its
    /// three, any instance namespace `{prefix}i<digits>`, its routers, the routed network's
    /// router and store).
    pub fn down_plan(&self, present: &[String]) -> Vec<Cmd> {
        present
            .iter()
            .filter(|ns| self.owns(ns))
            .map(|ns| Cmd::new(&["ip", "netns", "del", ns]).may_fail())
            .collect()
    }

    /// Whether namespace `ns` is one this lab makes.
    fn owns(&self, ns: &str) -> bool {
        self.namespaces().iter().any(|n| n == ns)
            || self.instance_index(ns).is_some()
            || self.router_index(ns).is_some()
            || self.routed_index(ns)
    }

    /// The commands that make (`on`) or remove Linux's own router in the nf namespace: the
    /// box's addresses on its ports and IPv4 forwarding. Under a [`kernel_nat_plan`]
    /// (Self::kernel_nat_plan), and under flowstate's XDP table pipeline, which filters and
    /// rewrites in front of the kernel's routing.
    pub fn kernel_router_plan(&self, on: bool) -> Vec<Cmd> {
        let n = self.nf_ns();
        let forwarding = |v: &str| Cmd {
            argv: Lab::in_ns(&n, &["sysctl", "-qw", &format!("net.ipv4.ip_forward={v}")]),
            may_fail: !on,
        };
        if on {
            let inside = format!("{BOX_INSIDE}/24");
            let outside = format!("{BOX_OUTSIDE}/24");
            vec![
                Cmd::new(&["ip", "-n", &n, "addr", "add", &inside, "dev", NF_INSIDE_IF]),
                Cmd::new(&[
                    "ip",
                    "-n",
                    &n,
                    "addr",
                    "add",
                    &outside,
                    "dev",
                    NF_OUTSIDE_IF,
                ]),
                forwarding("1"),
            ]
        } else {
            vec![
                forwarding("0"),
                Cmd::new(&["ip", "-n", &n, "addr", "flush", "dev", NF_INSIDE_IF]).may_fail(),
                Cmd::new(&["ip", "-n", &n, "addr", "flush", "dev", NF_OUTSIDE_IF]).may_fail(),
                // The client and server cached the box's MAC from flowstate's ARP answers:
                // the same MACs, so nothing to flush there.
            ]
        }
    }

    /// The commands that make (`on`) or remove Linux's own NAT in the nf namespace: its
    /// router ([`kernel_router_plan`](Self::kernel_router_plan)) and an nftables masquerade
    /// on the outside port. Used as the benchmark's peer; flowstate must not run meanwhile.
    pub fn kernel_nat_plan(&self, on: bool) -> Vec<Cmd> {
        let n = self.nf_ns();
        if on {
            let nft = |args: &[&str]| Cmd {
                argv: Lab::in_ns(&n, &[&["nft"][..], args].concat()),
                may_fail: false,
            };
            let oif = format!("\"{NF_OUTSIDE_IF}\"");
            let mut plan = self.kernel_router_plan(true);
            plan.extend([
                nft(&["add", "table", "ip", KERNEL_NAT_TABLE]),
                nft(&[
                    "add",
                    "chain",
                    "ip",
                    KERNEL_NAT_TABLE,
                    "post",
                    "{ type nat hook postrouting priority srcnat; policy accept; }",
                ]),
                nft(&[
                    "add",
                    "rule",
                    "ip",
                    KERNEL_NAT_TABLE,
                    "post",
                    "oifname",
                    &oif,
                    "masquerade",
                ]),
            ]);
            plan
        } else {
            let mut plan = vec![Cmd {
                argv: Lab::in_ns(&n, &["nft", "delete", "table", "ip", KERNEL_NAT_TABLE]),
                may_fail: true,
            }];
            plan.extend(self.kernel_router_plan(false));
            plan
        }
    }

    /// Which of this lab's namespaces exist: its three (in the order they are made), then its
    /// instance namespaces (by k), then its kernel-HA routers, then the routed network's router
    /// and store.
    pub fn present(&self, exec: &mut dyn Exec) -> Result<Vec<String>, LabError> {
        let out = exec.run(&Cmd::new(&["ip", "netns", "list"]))?;
        let names: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let mut v: Vec<String> = self
            .namespaces()
            .into_iter()
            .filter(|ns| names.contains(&ns.as_str()))
            .collect();
        let mut instances: Vec<(u64, &str)> = names
            .iter()
            .filter_map(|n| self.instance_index(n).map(|k| (k, *n)))
            .collect();
        instances.sort();
        v.extend(instances.into_iter().map(|(_, n)| n.to_owned()));
        let mut routers: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| self.router_index(n).is_some())
            .collect();
        routers.sort_unstable();
        v.extend(routers.into_iter().map(str::to_owned));
        for ns in self.routed_namespaces() {
            if names.contains(&ns.as_str()) {
                v.push(ns);
            }
        }
        Ok(v)
    }

    fn read_pids(&self) -> Vec<(String, u32, String)> {
        let Ok(text) = std::fs::read_to_string(self.pid_file()) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let name = it.next()?.to_owned();
                let pid = it.next()?.parse().ok()?;
                let argv0 = it.next()?.to_owned();
                Some((name, pid, argv0))
            })
            .collect()
    }

    /// The lab's servers that run: (name, pid).
    fn running_servers(&self, exec: &mut dyn Exec) -> Vec<(String, u32)> {
        self.read_pids()
            .into_iter()
            .filter(|(_, pid, argv0)| exec.alive(*pid, argv0))
            .map(|(name, pid, _)| (name, pid))
            .collect()
    }

    /// Whether the three namespaces exist and the servers run (instances and routers aside).
    fn base_complete(&self, present: &[String], servers: &[(String, u32)]) -> bool {
        self.namespaces().iter().all(|ns| present.contains(ns))
            && self
                .servers()
                .iter()
                .all(|w| servers.iter().any(|(n, _)| n == w.name))
    }

    /// What exists of this lab.
    pub fn status(&self, exec: &mut dyn Exec) -> Result<Status, LabError> {
        let namespaces = self.present(exec)?;
        let mut servers = self.running_servers(exec);
        let daemons = self.running_ha_daemons(exec);
        let instances: Vec<String> = namespaces
            .iter()
            .filter(|ns| self.instance_index(ns).is_some())
            .cloned()
            .collect();
        let routers: Vec<String> = namespaces
            .iter()
            .filter(|ns| self.router_index(ns).is_some())
            .cloned()
            .collect();
        let routed = namespaces.contains(&self.cluster_router_ns());
        let mut complete = self.base_complete(&namespaces, &servers);
        if complete && self.instances > 0 {
            complete = if self.routed {
                routed && namespaces.contains(&self.store_ns()) && self.routed_ok(exec)?
            } else {
                self.bridge_ok(exec)?
            };
            for k in 1..=self.instances {
                complete = complete
                    && namespaces.contains(&self.instance_ns(k))
                    && if self.routed {
                        self.routed_instance_ok(exec, k)?
                    } else {
                        self.instance_ok(exec, k)?
                    };
            }
        }
        if complete && !routers.is_empty() {
            complete = self.ha_complete(&namespaces, &daemons);
        }
        servers.extend(daemons);
        Ok(Status {
            namespaces,
            servers,
            instances,
            routers,
            routed,
            complete,
        })
    }

    /// Makes the lab (see the crate promises). Returns whether anything was made or removed
    /// (`false`: it was already complete).
    ///
    /// The lab itself (its three namespaces and servers) is left as it is when complete and
    /// made anew when not (a rebuild removes kernel HA too); then the instance namespaces are
    /// reconciled with [`Lab::instances`]: missing or broken ones are made, extra ones removed,
    /// complete ones left alone (all are remade only if the cluster bridge itself, or with
    /// [`Lab::with_routed`] the router or a link of the root's or the store's host, was
    /// broken; a lab made with the other kind of cluster network gets it replaced).
    /// On any failure everything is removed.
    pub fn up(&self, exec: &mut dyn Exec) -> Result<bool, LabError> {
        if self.routed && self.instances == 0 {
            return Err(LabError::RoutedWithoutInstances(self.prefix.clone()));
        }
        let made = self.up_inner(exec);
        if made.is_err() {
            // Leave nothing half made.
            let _ = self.down(exec);
        }
        made
    }

    fn up_inner(&self, exec: &mut dyn Exec) -> Result<bool, LabError> {
        let present = self.present(exec)?;
        let servers = self.running_servers(exec);
        let mut made = false;
        let present = if self.base_complete(&present, &servers) {
            present
        } else {
            self.down(exec)?;
            self.build(exec)?;
            made = true;
            self.present(exec)?
        };
        made |= self.reconcile_instances(exec, &present)?;
        Ok(made)
    }

    fn build(&self, exec: &mut dyn Exec) -> Result<(), LabError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| LabError::Io { path, source }
        };
        for b in ['a', 'b'] {
            let www = self.www(b);
            std::fs::create_dir_all(&www).map_err(io(&www))?;
            let who = www.join("backend");
            std::fs::write(&who, format!("{b}\n")).map_err(io(&who))?;
        }
        for cmd in self.up_plan() {
            exec.run(&cmd)?;
        }
        let mut pids = String::new();
        for server in self.servers() {
            let log = self.log(server.name);
            let pid = exec.spawn(&server.cmd, &log)?;
            let _ = writeln!(pids, "{} {} {}", server.name, pid, server.marker);
            let pf = self.pid_file();
            std::fs::write(&pf, &pids).map_err(io(&pf))?;
        }
        // Wait until each server listens (at most ~5 s).
        let s = self.server_ns();
        let listening = |exec: &mut dyn Exec| -> Result<bool, LabError> {
            let out = exec.run(&Cmd {
                argv: Lab::in_ns(&s, &["ss", "-Hltn"]),
                may_fail: true,
            })?;
            Ok([
                (SERVER, HTTP_PORT),
                (SERVER2, HTTP_PORT),
                (SERVER, IPERF_PORT),
            ]
            .iter()
            .all(|(a, p)| out.contains(&format!("{a}:{p}"))))
        };
        for _ in 0..100 {
            if listening(exec)? {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Err(LabError::NotStarted {
            what: "the lab's servers".into(),
            log: self.state_dir.clone(),
        })
    }

    /// Removes the lab (see the crate promises): also its instance namespaces (any
    /// `{prefix}i<digits>`, whatever count it was made with), its kernel-HA routers and
    /// their daemons, and the routed network's router and store namespaces (routed or not).
    pub fn down(&self, exec: &mut dyn Exec) -> Result<Vec<u32>, LabError> {
        self.stop_ha_daemons(exec)?;
        self.stop_checkers(exec);
        for (_, pid, argv0) in self.read_pids() {
            if exec.alive(pid, &argv0) {
                exec.kill(pid);
            }
        }
        let present = self.present(exec)?;
        let stopped = self.stop_inside(exec, &present)?;
        for cmd in self.down_plan(&present) {
            exec.run(&cmd)?;
        }
        match std::fs::remove_dir_all(&self.state_dir) {
            Ok(()) => Ok(stopped),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(stopped),
            Err(source) => Err(LabError::Io {
                path: self.state_dir.clone(),
                source,
            }),
        }
    }

    /// Stops every process still running in the lab's namespaces among `present` (a cluster's
    /// roles, a shell): SIGTERM, up to [`STOP_GRACE`] to end, then SIGKILL. A process left in
    /// a deleted namespace would run on, unreachable and unseen. The pids signalled.
    fn stop_inside(&self, exec: &mut dyn Exec, present: &[String]) -> Result<Vec<u32>, LabError> {
        let mut pids = Vec::new();
        for ns in present.iter().filter(|ns| self.owns(ns)) {
            let out = exec.run(&Cmd::new(&["ip", "netns", "pids", ns]).may_fail())?;
            pids.extend(out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
        pids.sort_unstable();
        pids.dedup();
        for &pid in &pids {
            exec.kill(pid);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while pids.iter().any(|&p| exec.alive(p, "")) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<String> = pids
            .iter()
            .filter(|&&p| exec.alive(p, ""))
            .map(u32::to_string)
            .collect();
        if !left.is_empty() {
            let mut argv = vec!["kill".to_owned(), "-KILL".to_owned()];
            argv.extend(left);
            exec.run(&Cmd {
                argv,
                may_fail: true,
            })?;
        }
        Ok(pids)
    }

    /// Switches Linux's own NAT in the nf namespace on or off ([`Lab::kernel_nat_plan`]).
    /// Switching it on switches kernel HA off ([`Lab::kernel_ha`]): the lab is one or the other.
    pub fn kernel_nat(&self, exec: &mut dyn Exec, on: bool) -> Result<(), LabError> {
        if on {
            self.kernel_ha(exec, false)?;
            for cmd in self.kernel_nat_plan(false) {
                exec.run(&cmd)?;
            }
        }
        for cmd in self.kernel_nat_plan(on) {
            exec.run(&cmd)?;
        }
        Ok(())
    }

    /// Switches Linux's own router in the nf namespace on or off
    /// ([`Lab::kernel_router_plan`]), after switching its NAT off.
    pub fn kernel_router(&self, exec: &mut dyn Exec, on: bool) -> Result<(), LabError> {
        self.kernel_nat(exec, false)?;
        if on {
            for cmd in self.kernel_router_plan(on) {
                exec.run(&cmd)?;
            }
        }
        Ok(())
    }

    /// The addresses and how to use them, for people.
    pub fn describe(&self) -> String {
        let (c, n, s) = (self.client_ns(), self.nf_ns(), self.server_ns());
        format!(
            "namespaces  {c} (client), {n} (the box), {s} (servers)\n\
             client      {CLIENT}/24 on {CLIENT_IF}, default via {BOX_INSIDE}\n\
             box         inside port {NF_INSIDE_IF} ({BOX_INSIDE}), outside port {NF_OUTSIDE_IF} ({BOX_OUTSIDE}); no kernel addresses: run flowstate there\n\
             server      {SERVER}/24 and {SERVER2}/24 on {SERVER_IF}, {INSIDE_NET} via {BOX_OUTSIDE}\n\
             http        http://{SERVER}:{HTTP_PORT}/ (backend a), http://{SERVER2}:{HTTP_PORT}/ (backend b)\n\
             iperf3      {SERVER}:{IPERF_PORT}\n\
             lb vip      {VIP}:{HTTP_PORT}\n\
             state       {}\n\
             try         ip netns exec {n} flowstate run examples/live-nat.toml\n\
             \x20           ip netns exec {c} curl http://{SERVER}:{HTTP_PORT}/backend\n{}",
            self.state_dir.display(),
            self.describe_instances(),
        )
    }
}

/// How long `down` lets the processes in the lab's namespaces end on SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// Whether process `pid` runs: it exists and is not a zombie (a killed process its parent
/// has not reaped yet runs nothing, though its pid still answers).
pub fn running(pid: u32) -> bool {
    pid > 0
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
}

/// Waits, at most `limit`, until process `pid` no longer [`running`]; whether it stopped.
pub fn wait_stopped(pid: u32, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while running(pid) {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_reaped_child_does_not() {
        assert!(running(std::process::id()));
        assert!(!running(0));
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!running(pid));
        assert!(wait_stopped(pid, std::time::Duration::ZERO));
        // A zombie (exited, not reaped) does not run either.
        let mut zombie = Command::new("true").spawn().unwrap();
        assert!(wait_stopped(zombie.id(), std::time::Duration::from_secs(5)));
        zombie.wait().unwrap();
    }
    use std::collections::HashSet;

    /// Records commands; `ip netns list` answers with `netns`; links made with `ip link add`
    /// (veths, bridges) and their addresses are remembered for `ip -br addr show` (or answered
    /// from `brief`), `ip netns pids` answers from `pids`.
    #[derive(Default)]
    struct Fake {
        ran: Vec<Cmd>,
        netns: Vec<String>,
        spawned: Vec<(Cmd, u32)>,
        killed: Vec<u32>,
        listen: bool,
        /// (namespace, device, addresses)
        links: Vec<(String, String, Vec<String>)>,
        /// Canned `ip -n NS -br -4 addr show dev DEV` answers: ((NS, DEV), answer).
        brief: Vec<((String, String), String)>,
        pids: String,
    }

    impl Fake {
        fn link(&mut self, ns: &str, dev: &str) {
            self.links.push((ns.to_owned(), dev.to_owned(), Vec::new()));
        }
    }

    impl Exec for Fake {
        fn run(&mut self, cmd: &Cmd) -> Result<String, LabError> {
            self.ran.push(cmd.clone());
            let a: Vec<&str> = cmd.argv.iter().map(String::as_str).collect();
            match a.as_slice() {
                ["ip", "netns", "list"] => Ok(self.netns.join("\n")),
                ["ip", "netns", "add", ns] => {
                    self.netns.push((*ns).to_owned());
                    Ok(String::new())
                }
                ["ip", "netns", "del", ns] => {
                    self.netns.retain(|n| n != ns);
                    self.links.retain(|(n, _, _)| n != ns);
                    Ok(String::new())
                }
                ["ip", "netns", "pids", _] => Ok(self.pids.clone()),
                ["ip", "link", "add", d, "netns", x, "type", "veth", "peer", "name", p, "netns", y]
                | ["ip", "link", "add", d, "mtu", _, "netns", x, "type", "veth", "peer", "name", p, "mtu", _, "netns", y] => {
                    self.link(x, d);
                    self.link(y, p);
                    Ok(String::new())
                }
                ["ip", "-n", ns, "link", "add", d, rest @ ..] if rest.contains(&"bridge") => {
                    self.link(ns, d);
                    Ok(String::new())
                }
                ["ip", "-n", ns, "link", "del", d] => {
                    self.links.retain(|(n, dev, _)| !(n == ns && dev == d));
                    Ok(String::new())
                }
                ["ip", "-n", ns, "addr", "add", addr, "dev", d] => {
                    if let Some(l) = self.links.iter_mut().find(|(n, dev, _)| n == ns && dev == d) {
                        l.2.push((*addr).to_owned());
                    }
                    Ok(String::new())
                }
                ["ip", "-n", ns, "-br", "-4", "addr", "show", "dev", d] => {
                    let key = ((*ns).to_owned(), (*d).to_owned());
                    if let Some((_, out)) = self.brief.iter().find(|(k, _)| *k == key) {
                        return Ok(out.clone());
                    }
                    Ok(self
                        .links
                        .iter()
                        .find(|(n, dev, _)| n == ns && dev == d)
                        .map(|(_, dev, addrs)| format!("{dev}@if9 UP {}\n", addrs.join(" ")))
                        .unwrap_or_default())
                }
                [.., "ss", "-Hltn"] if self.listen => Ok(format!(
                    "LISTEN 0 5 {SERVER}:{HTTP_PORT} *\nLISTEN 0 5 {SERVER2}:{HTTP_PORT} *\nLISTEN 0 5 {SERVER}:{IPERF_PORT} *"
                )),
                _ => Ok(String::new()),
            }
        }
        fn spawn(&mut self, cmd: &Cmd, _log: &Path) -> Result<u32, LabError> {
            let pid = 1000 + self.spawned.len() as u32;
            self.spawned.push((cmd.clone(), pid));
            Ok(pid)
        }
        fn kill(&mut self, pid: u32) {
            self.killed.push(pid);
        }
        fn alive(&mut self, pid: u32, _marker: &str) -> bool {
            self.spawned.iter().any(|(_, p)| *p == pid) && !self.killed.contains(&pid)
        }
    }

    fn lab() -> (Lab, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (Lab::with_state_root("fs-u-", dir.path()).unwrap(), dir)
    }

    #[test]
    fn prefixes_are_checked() {
        for bad in ["", "Fs-", "1fs", "fs_x", "fs x", "a".repeat(25).as_str()] {
            assert!(Lab::new(bad).is_err(), "{bad:?}");
        }
        assert!(Lab::new("fs-").is_ok());
    }

    #[test]
    fn every_name_made_carries_the_prefix() {
        let (lab, _d) = lab();
        let plan = lab.up_plan();
        for cmd in &plan {
            let a = &cmd.argv;
            if a[..3] == ["ip", "netns", "add"] {
                assert!(a[3].starts_with("fs-u-"), "{}", cmd.line());
            }
            if let Some(i) = a.iter().position(|x| x == "-n" || x == "netns") {
                if a[i + 1] != "add" && a[i + 1] != "exec" {
                    assert!(a[i + 1].starts_with("fs-u-"), "{}", cmd.line());
                }
            }
            if a[..2] == ["ip", "link"] && a[2] == "add" {
                // Both ends are created inside lab namespaces, never in the caller's.
                assert_eq!(a.iter().filter(|x| *x == "netns").count(), 2);
            }
            if a[..3] == ["ip", "netns", "exec"] {
                assert!(a[3].starts_with("fs-u-"));
            }
        }
    }

    #[test]
    fn routes_send_client_server_traffic_through_the_box() {
        let (lab, _d) = lab();
        let plan: Vec<String> = lab.up_plan().iter().map(Cmd::line).collect();
        assert!(plan.contains(&format!(
            "ip -n fs-u-client route add default via {BOX_INSIDE}"
        )));
        assert!(plan.contains(&format!(
            "ip -n fs-u-server route add {INSIDE_NET} via {BOX_OUTSIDE}"
        )));
        // The box's ports carry no kernel address and the kernel does not forward.
        assert!(!plan.iter().any(|l| l.starts_with("ip -n fs-u-nf addr add")));
        assert!(plan
            .iter()
            .any(|l| l.ends_with("fs-u-nf sysctl -qw net.ipv4.ip_forward=0")));
        // Offloads off on all four ends.
        for dev in [CLIENT_IF, NF_INSIDE_IF, NF_OUTSIDE_IF, SERVER_IF] {
            assert!(
                plan.iter()
                    .any(|l| l.contains(&format!("ethtool -K {dev} tx off"))),
                "{dev}"
            );
        }
    }

    #[test]
    fn up_is_idempotent_and_down_removes_what_up_made() {
        let (lab, _d) = lab();
        let mut fake = Fake {
            listen: true,
            netns: vec!["other".into(), "fs-client".into()],
            ..Fake::default()
        };
        assert!(lab.up(&mut fake).unwrap());
        let made: HashSet<String> = fake
            .netns
            .iter()
            .filter(|n| n.starts_with("fs-u-"))
            .cloned()
            .collect();
        assert_eq!(made.len(), 3);
        assert_eq!(fake.spawned.len(), 3);
        assert!(lab.www('a').join("backend").exists());

        // Again: complete, nothing is made.
        let before = fake.ran.len();
        assert!(!lab.up(&mut fake).unwrap());
        assert!(fake.ran[before..]
            .iter()
            .all(|c| c.argv[..3] == ["ip", "netns", "list"]));
        assert_eq!(fake.spawned.len(), 3);

        lab.down(&mut fake).unwrap();
        assert_eq!(fake.netns, vec!["other".to_owned(), "fs-client".to_owned()]);
        assert_eq!(fake.killed, vec![1000, 1001, 1002]);
        assert!(!lab.state_dir().exists());
        // Down again: nothing to do, still fine.
        lab.down(&mut fake).unwrap();
        assert_eq!(fake.netns.len(), 2);
    }

    #[test]
    fn a_partial_lab_is_rebuilt() {
        let (lab, _d) = lab();
        let mut fake = Fake {
            listen: true,
            netns: vec!["fs-u-nf".into()],
            ..Fake::default()
        };
        assert!(lab.up(&mut fake).unwrap());
        let dels: Vec<String> = fake
            .ran
            .iter()
            .map(Cmd::line)
            .filter(|l| l.starts_with("ip netns del"))
            .collect();
        assert_eq!(dels, vec!["ip netns del fs-u-nf".to_owned()]);
        assert_eq!(fake.netns.len(), 3);
    }

    #[test]
    fn a_failed_up_leaves_nothing() {
        let (lab, _d) = lab();
        let mut fake = Fake {
            listen: false,
            ..Fake::default()
        };
        assert!(matches!(
            lab.up(&mut fake),
            Err(LabError::NotStarted { .. })
        ));
        assert!(fake.netns.is_empty());
        assert_eq!(fake.killed.len(), 3);
        assert!(!lab.state_dir().exists());
    }

    #[test]
    fn kernel_nat_touches_only_the_nf_namespace() {
        let (lab, _d) = lab();
        for on in [true, false] {
            for cmd in lab.kernel_nat_plan(on) {
                let l = cmd.line();
                assert!(
                    l.starts_with("ip -n fs-u-nf ") || l.starts_with("ip netns exec fs-u-nf "),
                    "{l}"
                );
            }
        }
        let on: Vec<String> = lab.kernel_nat_plan(true).iter().map(Cmd::line).collect();
        assert!(on.iter().any(|l| l.contains("masquerade")));
        let router: Vec<String> = lab.kernel_router_plan(true).iter().map(Cmd::line).collect();
        assert!(router.iter().any(|l| l.ends_with("net.ipv4.ip_forward=1")));
        assert!(!router.iter().any(|l| l.contains("nft")));
    }

    fn lines(plan: &[Cmd]) -> Vec<String> {
        plan.iter().map(Cmd::line).collect()
    }

    /// Every namespace named in `plan` is one of `lab`'s, and every veth is made with both ends
    /// in lab namespaces.
    fn assert_prefixed(lab: &Lab, plan: &[Cmd]) {
        for cmd in plan {
            let a = &cmd.argv;
            let l = cmd.line();
            if a[..2] == ["ip", "-n"]
                || a[..3] == ["ip", "netns", "exec"]
                || a[..3] == ["ip", "netns", "add"]
            {
                let ns = if a[1] == "-n" { &a[2] } else { &a[3] };
                assert!(lab.owns(ns), "{l}");
            }
            if a[..3] == ["ip", "link", "add"] {
                let ends: Vec<&String> = a
                    .iter()
                    .enumerate()
                    .filter(|(i, x)| *x == "netns" && *i > 0)
                    .map(|(i, _)| &a[i + 1])
                    .collect();
                assert_eq!(ends.len(), 2, "{l}");
                assert!(ends.iter().all(|ns| lab.owns(ns)), "{l}");
            }
        }
    }

    #[test]
    fn instances_are_named_and_numbered() {
        let (lab, _d) = lab();
        assert_eq!(lab.instances(), 0);
        assert_eq!(instance_addr(1), Ipv4Addr::new(192, 0, 2, 11));
        assert_eq!(instance_addr(MAX_INSTANCES), Ipv4Addr::new(192, 0, 2, 26));
        assert_eq!(lab.instance_ns(3), "fs-u-i3");
        assert_eq!(instance_port(3), "fs-cl3");
        assert!(matches!(
            lab.clone().with_instances(MAX_INSTANCES + 1),
            Err(LabError::Instances(17))
        ));
        assert_eq!(lab.clone().with_instances(16).unwrap().instances(), 16);
        assert_eq!(lab.clone().with_instances(0).unwrap(), lab);
        assert_eq!(ROOT_ADDR.to_string() + "/24", "192.0.2.1/24");
        assert!(CLUSTER_NET.starts_with("192.0.2.0/"));
        // Only digits after `{prefix}i` are instances: other labs' names are not.
        assert_eq!(lab.instance_index("fs-u-i12"), Some(12));
        for not in ["fs-u-i", "fs-u-inf", "fs-u-i1x", "fs-i1", "fs-u-client"] {
            assert_eq!(lab.instance_index(not), None, "{not}");
        }
    }

    #[test]
    #[should_panic(expected = "instances are numbered 1 to 16")]
    fn instance_zero_has_no_address() {
        let _ = instance_addr(0);
    }

    #[test]
    fn instances_join_the_cluster_bridge_and_nothing_is_routed() {
        let (lab, _d) = lab();
        let lab = lab.with_instances(2).unwrap();
        let mut plan = lab.cluster_plan();
        plan.extend(lab.instance_plan(1));
        plan.extend(lab.instance_plan(2));
        assert_prefixed(&lab, &plan);
        let l = lines(&plan);
        for want in [
            "ip -n fs-u-nf link add fs-cl address 02:00:c0:00:02:01 mtu 9000 type bridge forward_delay 0"
                .to_owned(),
            "ip -n fs-u-nf addr add 192.0.2.1/24 dev fs-cl".to_owned(),
            "ip netns add fs-u-i2".to_owned(),
            "ip link add fs-i mtu 9000 netns fs-u-i2 type veth peer name fs-cl2 mtu 9000 netns fs-u-nf".to_owned(),
            "ip -n fs-u-nf link set fs-cl2 master fs-cl".to_owned(),
            "ip -n fs-u-i2 addr add 192.0.2.12/24 dev fs-i".to_owned(),
            "ip -n fs-u-i2 link set lo up".to_owned(),
            "ip netns exec fs-u-i2 sysctl -qw net.ipv6.conf.all.disable_ipv6=1".to_owned(),
        ] {
            assert!(l.contains(&want), "{want}");
        }
        for dev in [
            ("fs-u-nf", "fs-cl"),
            ("fs-u-nf", "fs-cl1"),
            ("fs-u-i1", "fs-i"),
        ] {
            assert!(
                l.iter().any(|x| x.starts_with(&format!(
                    "ip netns exec {} ethtool -K {} tx off",
                    dev.0, dev.1
                ))),
                "{dev:?}"
            );
        }
        assert!(!l.iter().any(|x| x.contains("ip_forward=1")));
        assert!(!l.iter().any(|x| x.contains("route")));
        let d = lab.describe();
        assert!(
            d.contains("192.0.2.1") && d.contains("fs-u-i2 192.0.2.12"),
            "{d}"
        );
    }

    #[test]
    fn up_reconciles_the_instances_and_down_removes_them_all() {
        let (lab, _d) = lab();
        let three = lab.clone().with_instances(3).unwrap();
        let mut fake = Fake {
            listen: true,
            netns: vec!["other".into(), "fs-u-inf".into()],
            ..Fake::default()
        };
        assert!(three.up(&mut fake).unwrap());
        let st = three.status(&mut fake).unwrap();
        assert!(st.complete, "{st:?}");
        assert_eq!(st.instances, vec!["fs-u-i1", "fs-u-i2", "fs-u-i3"]);
        assert_eq!(st.namespaces.len(), 6);

        // Complete: nothing is made, only looked at.
        let before = fake.ran.len();
        assert!(!three.up(&mut fake).unwrap());
        for c in &fake.ran[before..] {
            let l = c.line();
            assert!(
                l == "ip netns list" || l.contains(" -br -4 addr show "),
                "{l}"
            );
        }

        // Trimmed to one: i2 and i3 go, nothing else is touched.
        let one = lab.clone().with_instances(1).unwrap();
        let before = fake.ran.len();
        assert!(one.up(&mut fake).unwrap());
        let dels: Vec<String> = fake.ran[before..]
            .iter()
            .map(Cmd::line)
            .filter(|l| l.contains(" del") || l.contains(" add "))
            .collect();
        assert_eq!(
            dels,
            vec![
                "ip -n fs-u-nf link del fs-cl2",
                "ip netns del fs-u-i2",
                "ip -n fs-u-nf link del fs-cl3",
                "ip netns del fs-u-i3"
            ]
        );
        assert!(one.status(&mut fake).unwrap().complete);

        // Grown to two: only i2 is made.
        let two = lab.clone().with_instances(2).unwrap();
        let before = fake.ran.len();
        assert!(two.up(&mut fake).unwrap());
        let adds: Vec<String> = fake.ran[before..]
            .iter()
            .map(Cmd::line)
            .filter(|l| l.starts_with("ip netns add") || l.starts_with("ip netns del"))
            .collect();
        assert_eq!(adds, vec!["ip netns add fs-u-i2"]);

        // A lab without instances: they go, and the bridge with them.
        fake.netns.push("fs-u-i9".into());
        let before = fake.ran.len();
        assert!(lab.up(&mut fake).unwrap());
        let l = lines(&fake.ran[before..]);
        assert!(
            l.contains(&"ip -n fs-u-nf link del fs-cl".to_owned()),
            "{l:?}"
        );
        assert!(!fake.netns.iter().any(|n| lab.instance_index(n).is_some()));

        // Down removes any instance namespace, whatever the count it was made with.
        fake.netns.push("fs-u-i4".into());
        lab.down(&mut fake).unwrap();
        assert_eq!(fake.netns, vec!["other".to_owned(), "fs-u-inf".to_owned()]);
    }

    #[test]
    fn a_broken_cluster_bridge_remakes_every_instance() {
        let (lab, _d) = lab();
        let two = lab.with_instances(2).unwrap();
        let mut fake = Fake {
            listen: true,
            ..Fake::default()
        };
        assert!(two.up(&mut fake).unwrap());
        fake.links.retain(|(_, d, _)| d != CLUSTER_BRIDGE);
        assert!(!two.status(&mut fake).unwrap().complete);
        let before = fake.ran.len();
        assert!(two.up(&mut fake).unwrap());
        let l = lines(&fake.ran[before..]);
        for want in [
            "ip -n fs-u-nf link add fs-cl address 02:00:c0:00:02:01 mtu 9000 type bridge forward_delay 0",
            "ip netns del fs-u-i1",
            "ip netns del fs-u-i2",
            "ip netns add fs-u-i1",
            "ip netns add fs-u-i2",
        ] {
            assert!(l.contains(&want.to_owned()), "{want}: {l:?}");
        }
        assert!(!l.contains(&"ip netns del fs-u-nf".to_owned()));
    }

    #[test]
    fn routed_hosts_each_have_a_link_of_their_own_to_the_router() {
        let (lab, _d) = lab();
        let lab = lab.with_instances(2).unwrap().with_routed(true);
        assert!(lab.routed());
        assert_eq!(lab.cluster_router_ns(), "fs-u-rt");
        assert_eq!(lab.store_ns(), "fs-u-st");
        assert_eq!(STORE_ADDR.to_string(), "192.0.2.5");
        let mut plan = lab.cluster_plan();
        assert_eq!(plan, lab.routed_plan());
        plan.extend(lab.instance_plan(1));
        plan.extend(lab.instance_plan(2));
        assert_eq!(lab.instance_plan(2), lab.routed_instance_plan(2));
        assert_prefixed(&lab, &plan);
        let l = lines(&plan);
        for want in [
            "ip netns add fs-u-rt",
            "ip netns add fs-u-st",
            "ip netns add fs-u-i2",
            "ip netns exec fs-u-rt sysctl -qw net.ipv4.ip_forward=1",
            "ip netns exec fs-u-rt sysctl -qw net.ipv4.conf.all.rp_filter=0",
            "ip netns exec fs-u-nf sysctl -qw net.ipv4.conf.all.rp_filter=0",
            "ip netns exec fs-u-st sysctl -qw net.ipv4.conf.all.rp_filter=0",
            "ip netns exec fs-u-i1 sysctl -qw net.ipv4.conf.all.rp_filter=0",
            "ip netns exec fs-u-rt sysctl -qw net.ipv4.conf.rt-i1.rp_filter=0",
            "ip netns exec fs-u-i1 sysctl -qw net.ipv4.conf.fs-i.rp_filter=0",
            "ip netns exec fs-u-i1 sysctl -qw net.ipv4.conf.fs-i.arp_announce=2",
            // The root's host: its own link, 192.0.2.1 as a /32, the cluster net via the router.
            "ip link add fs-rt mtu 9000 netns fs-u-nf type veth peer name rt-nf mtu 9000 netns fs-u-rt",
            "ip -n fs-u-rt addr add 10.200.0.1/30 dev rt-nf",
            "ip -n fs-u-nf addr add 10.200.0.2/30 dev fs-rt",
            "ip -n fs-u-nf addr add 192.0.2.1/32 dev fs-rt",
            "ip -n fs-u-nf route add 192.0.2.0/24 via 10.200.0.1 dev fs-rt src 192.0.2.1",
            "ip -n fs-u-rt route add 192.0.2.1/32 via 10.200.0.2 dev rt-nf",
            // The store's.
            "ip link add fs-st mtu 9000 netns fs-u-st type veth peer name rt-st mtu 9000 netns fs-u-rt",
            "ip -n fs-u-st addr add 192.0.2.5/32 dev fs-st",
            "ip -n fs-u-st route add 192.0.2.0/24 via 10.200.100.1 dev fs-st src 192.0.2.5",
            "ip -n fs-u-rt route add 192.0.2.5/32 via 10.200.100.2 dev rt-st",
            // Instance 2's.
            "ip link add fs-i mtu 9000 netns fs-u-i2 type veth peer name rt-i2 mtu 9000 netns fs-u-rt",
            "ip -n fs-u-rt addr add 10.200.2.1/30 dev rt-i2",
            "ip -n fs-u-i2 addr add 10.200.2.2/30 dev fs-i",
            "ip -n fs-u-i2 addr add 192.0.2.12/32 dev fs-i",
            "ip -n fs-u-i2 link set fs-i up",
            "ip -n fs-u-i2 route add 192.0.2.0/24 via 10.200.2.1 dev fs-i src 192.0.2.12",
            "ip -n fs-u-rt route add 192.0.2.12/32 via 10.200.2.2 dev rt-i2",
            "ip -n fs-u-rt link set rt-i2 up",
        ] {
            assert!(l.contains(&want.to_owned()), "{want}: {l:#?}");
        }
        // Offloads off on both ends of every link.
        for (ns, dev) in [
            ("fs-u-nf", "fs-rt"),
            ("fs-u-rt", "rt-nf"),
            ("fs-u-st", "fs-st"),
            ("fs-u-rt", "rt-st"),
            ("fs-u-i1", "fs-i"),
            ("fs-u-rt", "rt-i1"),
        ] {
            assert!(
                l.contains(&format!(
                    "ip netns exec {ns} ethtool -K {dev} tx off rx off gro off"
                )),
                "{ns} {dev}"
            );
        }
        // Every veth is 9000 on both ends, one end in the router; no bridge, nothing shared.
        let veths: Vec<&String> = l.iter().filter(|x| x.starts_with("ip link add")).collect();
        assert_eq!(veths.len(), 4, "{veths:?}");
        for v in veths {
            assert_eq!(v.matches("mtu 9000").count(), 2, "{v}");
            assert!(v.ends_with("netns fs-u-rt"), "{v}");
        }
        assert!(!l
            .iter()
            .any(|x| x.contains("bridge") || x.contains("master")));
        assert!(!l.iter().any(|x| x.contains(&format!("{}/24", ROOT_ADDR))));
        // Only the router forwards, and it knows no route beyond the cluster's hosts.
        let fwd: Vec<&String> = l.iter().filter(|x| x.contains("ip_forward")).collect();
        assert_eq!(fwd.len(), 1, "{fwd:?}");
        assert!(!l
            .iter()
            .any(|x| x.starts_with("ip -n fs-u-rt route add") && !x.contains("/32 via 10.200.")));
        let d = lab.describe();
        assert!(
            d.contains("routed") && d.contains("fs-u-st 192.0.2.5"),
            "{d}"
        );
        assert!(
            d.contains("fs-u-i2 192.0.2.12 (fs-i 10.200.2.2/30, via 10.200.2.1)"),
            "{d}"
        );
        assert_eq!(
            RoutedHost::Instance(16).link().1,
            Ipv4Addr::new(10, 200, 16, 2)
        );
        assert_eq!(RoutedHost::Store.link().0, Ipv4Addr::new(10, 200, 100, 1));
    }

    #[test]
    fn a_routed_lab_needs_instances() {
        let (lab, _d) = lab();
        let mut fake = Fake {
            listen: true,
            ..Fake::default()
        };
        assert!(matches!(
            lab.clone().with_routed(true).up(&mut fake),
            Err(LabError::RoutedWithoutInstances(_))
        ));
        assert!(fake.ran.is_empty() && fake.netns.is_empty());
    }

    #[test]
    fn routed_up_reconciles_and_down_removes_the_router_and_the_store() {
        let (lab, _d) = lab();
        let routed = |n| lab.clone().with_instances(n).unwrap().with_routed(true);
        let three = routed(3);
        let mut fake = Fake {
            listen: true,
            netns: vec!["other".into(), "fs-rt".into()],
            ..Fake::default()
        };
        assert!(three.up(&mut fake).unwrap());
        let st = three.status(&mut fake).unwrap();
        assert!(st.complete && st.routed, "{st:?}");
        assert_eq!(
            st.namespaces,
            [
                "fs-u-client",
                "fs-u-nf",
                "fs-u-server",
                "fs-u-i1",
                "fs-u-i2",
                "fs-u-i3",
                "fs-u-rt",
                "fs-u-st"
            ]
        );
        // The same lab without --routed is not complete (its instances are not on a bridge).
        assert!(
            !lab.clone()
                .with_instances(3)
                .unwrap()
                .status(&mut fake)
                .unwrap()
                .complete
        );

        // Complete: nothing is made, only looked at.
        let before = fake.ran.len();
        assert!(!three.up(&mut fake).unwrap());
        for c in &fake.ran[before..] {
            let l = c.line();
            assert!(
                l == "ip netns list" || l.contains(" -br -4 addr show "),
                "{l}"
            );
        }

        // Trimmed to one: i2 and i3 go with the router's ends of their links.
        let before = fake.ran.len();
        assert!(routed(1).up(&mut fake).unwrap());
        let dels: Vec<String> = fake.ran[before..]
            .iter()
            .map(Cmd::line)
            .filter(|l| l.contains(" del") || l.contains(" add "))
            .collect();
        assert_eq!(
            dels,
            vec![
                "ip -n fs-u-nf link del fs-cl2",
                "ip -n fs-u-rt link del rt-i2",
                "ip netns del fs-u-i2",
                "ip -n fs-u-nf link del fs-cl3",
                "ip -n fs-u-rt link del rt-i3",
                "ip netns del fs-u-i3"
            ]
        );

        // A broken router: the network and every instance are made anew.
        fake.links.retain(|(ns, _, _)| ns != "fs-u-rt");
        assert!(!routed(2).status(&mut fake).unwrap().complete);
        let before = fake.ran.len();
        assert!(routed(2).up(&mut fake).unwrap());
        let l = lines(&fake.ran[before..]);
        for want in [
            "ip -n fs-u-nf link del fs-rt",
            "ip netns del fs-u-rt",
            "ip netns del fs-u-st",
            "ip netns add fs-u-rt",
            "ip netns add fs-u-st",
            "ip netns del fs-u-i1",
            "ip netns add fs-u-i1",
            "ip netns add fs-u-i2",
        ] {
            assert!(l.contains(&want.to_owned()), "{want}: {l:#?}");
        }
        assert!(!l.contains(&"ip netns del fs-u-nf".to_owned()));
        assert!(routed(2).status(&mut fake).unwrap().complete);

        // Without --routed: the router and the store go, a bridge comes, the instances are
        // made anew on it; and back.
        let bridged = lab.clone().with_instances(2).unwrap();
        let before = fake.ran.len();
        assert!(bridged.up(&mut fake).unwrap());
        let l = lines(&fake.ran[before..]);
        for want in [
            "ip -n fs-u-nf link del fs-rt",
            "ip netns del fs-u-rt",
            "ip netns del fs-u-st",
            "ip -n fs-u-nf addr add 192.0.2.1/24 dev fs-cl",
            "ip netns del fs-u-i1",
            "ip -n fs-u-i1 addr add 192.0.2.11/24 dev fs-i",
        ] {
            assert!(l.contains(&want.to_owned()), "{want}: {l:#?}");
        }
        let st = bridged.status(&mut fake).unwrap();
        assert!(st.complete && !st.routed, "{st:?}");
        let before = fake.ran.len();
        assert!(routed(2).up(&mut fake).unwrap());
        let l = lines(&fake.ran[before..]);
        assert!(
            l.contains(&"ip -n fs-u-nf link del fs-cl".to_owned()),
            "{l:#?}"
        );
        assert!(l.contains(&"ip netns add fs-u-rt".to_owned()), "{l:#?}");
        assert!(routed(2).status(&mut fake).unwrap().complete);

        // Down (routed or not) removes all of it, and nothing else.
        lab.down(&mut fake).unwrap();
        assert_eq!(fake.netns, vec!["other".to_owned(), "fs-rt".to_owned()]);
    }

    #[test]
    fn kernel_ha_is_made_in_the_lab_namespaces_only() {
        let (lab, _d) = lab();
        let plan = lab.kernel_ha_plan();
        assert_prefixed(&lab, &plan);
        let l = lines(&plan);
        for want in [
            "ip netns add fs-u-r1",
            "ip netns add fs-u-r2",
            "ip -n fs-u-nf link add fs-ib type bridge forward_delay 0 mcast_snooping 0",
            "ip -n fs-u-nf link set fs-in master fs-ib",
            "ip -n fs-u-nf link set fs-out master fs-ob",
            "ip -n fs-u-nf link set fs-r2i master fs-ib",
            "ip -n fs-u-nf link set fs-r1o master fs-ob",
            "ip link add fs-ri netns fs-u-r1 type veth peer name fs-r1i netns fs-u-nf",
            "ip link add fs-rs netns fs-u-r1 type veth peer name fs-rs netns fs-u-r2",
            "ip -n fs-u-r1 addr add 10.0.0.252/24 dev fs-ri",
            "ip -n fs-u-r2 addr add 198.51.100.253/24 dev fs-ro",
            "ip -n fs-u-r2 addr add 198.18.0.2/24 dev fs-rs",
            "ip netns exec fs-u-r1 sysctl -qw net.ipv4.ip_forward=1",
        ] {
            assert!(l.contains(&want.to_owned()), "{want}");
        }
        // The VIPs are keepalived's, the nf namespace stays a switch.
        assert!(!l.iter().any(
            |x| x.contains(&format!("{BOX_INSIDE}/")) || x.contains(&format!("{BOX_OUTSIDE}/"))
        ));
        assert!(!l
            .iter()
            .any(|x| x.contains("fs-u-nf") && x.contains("ip_forward=1")));
        assert!(!l.iter().any(|x| x.starts_with("ip -n fs-u-nf addr add")));
        for r in ["fs-u-r1", "fs-u-r2"] {
            assert!(l.contains(&format!(
                "ip netns exec {r} nft -f {}",
                lab.ha_dir().join("nft.conf").display()
            )));
            for dev in [HA_INSIDE_IF, HA_OUTSIDE_IF, HA_SYNC_IF] {
                assert!(l.contains(&format!(
                    "ip netns exec {r} ethtool -K {dev} tx off rx off gro off"
                )));
            }
        }
    }

    #[test]
    fn kernel_ha_runs_from_the_state_directory_only() {
        let (lab, _d) = lab();
        let files = lab.kernel_ha_files();
        let state = lab.state_dir().to_string_lossy().into_owned();
        let text = |name: &str, r: u32| {
            files
                .iter()
                .find(|(p, _, _)| *p == lab.ha_router_dir(r).join(name))
                .map(|(_, t, _)| t.clone())
                .unwrap()
        };
        for (path, t, _) in &files {
            assert!(path.starts_with(lab.state_dir()));
            for system in ["/etc/", "/var/", "/run/conntrackd", "/run/keepalived"] {
                assert!(!t.contains(system), "{}: {system}", path.display());
            }
        }
        let (c1, c2) = (text("conntrackd.conf", 1), text("conntrackd.conf", 2));
        for (c, me, peer) in [
            (&c1, "198.18.0.1", "198.18.0.2"),
            (&c2, "198.18.0.2", "198.18.0.1"),
        ] {
            assert!(c.contains("Mode FTFW"));
            assert!(c.contains(&format!("IPv4_address {me}\n")));
            assert!(c.contains(&format!("IPv4_Destination_Address {peer}\n")));
            assert!(c.contains(&format!("Path {state}/ha/")));
            assert!(c.contains(&format!("LockFile {state}/ha/")));
        }
        assert!(c1.contains("/ha/r1/conntrackd.ctl") && c2.contains("/ha/r2/conntrackd.ctl"));
        assert!(c1.contains("/ha/r1/conntrackd.lock") && c2.contains("/ha/r2/conntrackd.lock"));
        let (k1, k2) = (text("keepalived.conf", 1), text("keepalived.conf", 2));
        assert!(k1.contains("state MASTER") && k1.contains("priority 150"));
        assert!(k2.contains("state BACKUP") && k2.contains("priority 100"));
        for k in [&k1, &k2] {
            assert!(k.contains("10.0.0.1/24 dev fs-ri") && k.contains("198.51.100.1/24 dev fs-ro"));
            assert!(k.contains("advert_int 0.1"));
        }
        assert!(k1.contains(&format!(
            "notify_master \"{}/ha/notify.sh {}/ha/r1/conntrackd.conf {}/ha/r1/notify.log primary\"",
            state, state, state
        )));
        let notify = &files
            .iter()
            .find(|(p, _, _)| p.ends_with("notify.sh"))
            .unwrap();
        assert!(notify.2, "executable");
        for call in ["ctd -c", "ctd -f", "ctd -R", "ctd -B", "ctd -t", "ctd -n"] {
            assert!(notify.1.contains(call), "{call}");
        }
        let nft = &files
            .iter()
            .find(|(p, _, _)| p.ends_with("nft.conf"))
            .unwrap()
            .1;
        assert!(nft.contains("snat to 198.51.100.1") && !nft.contains("masquerade"));

        // Each daemon in its router, with its own files.
        let d = lab.kernel_ha_daemons();
        let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "conntrackd-r1",
                "conntrackd-r2",
                "keepalived-r1",
                "keepalived-r2"
            ]
        );
        for (daemon, r) in d.iter().zip([1, 2, 1, 2]) {
            let l = daemon.cmd.line();
            assert!(l.starts_with(&format!("ip netns exec fs-u-r{r} ")), "{l}");
            assert!(l.contains(&daemon.marker));
            assert!(daemon.marker.starts_with(&format!("{state}/ha/r{r}/")));
        }
        assert!(d[2]
            .cmd
            .line()
            .contains(&format!("--pid {state}/ha/r1/keepalived.pid")));
        assert!(d[3]
            .cmd
            .line()
            .contains(&format!("--vrrp_pid {state}/ha/r2/vrrp.pid")));
    }

    #[test]
    fn ha_master_is_the_router_with_both_addresses_up() {
        let (lab, _d) = lab();
        let brief =
            |ns: &str, dev: &str, out: &str| ((ns.to_owned(), dev.to_owned()), out.to_owned());
        let holding = |ns: &str, state: &str| {
            vec![
                brief(
                    ns,
                    "fs-ri",
                    &format!("fs-ri@if3 {state} 10.0.0.25x/24 10.0.0.1/24\n"),
                ),
                brief(
                    ns,
                    "fs-ro",
                    &format!("fs-ro@if4 {state} 198.51.100.25x/24 198.51.100.1/24\n"),
                ),
            ]
        };
        let mut fake = Fake::default();
        assert_eq!(lab.ha_master(&mut fake).unwrap(), None);
        fake.brief = holding("fs-u-r1", "UP");
        assert_eq!(
            lab.ha_master(&mut fake).unwrap(),
            Some("fs-u-r1".to_owned())
        );
        // A crashed primary keeps its addresses on links that are down.
        fake.brief = holding("fs-u-r1", "DOWN");
        fake.brief.extend(holding("fs-u-r2", "UP"));
        assert_eq!(
            lab.ha_master(&mut fake).unwrap(),
            Some("fs-u-r2".to_owned())
        );
        fake.brief = holding("fs-u-r1", "UP");
        fake.brief.extend(holding("fs-u-r2", "UP"));
        assert!(matches!(lab.ha_master(&mut fake), Err(LabError::Ha { .. })));
        // Half a transition: nobody yet.
        fake.brief = holding("fs-u-r2", "UP");
        fake.brief.pop();
        assert_eq!(lab.ha_master(&mut fake).unwrap(), None);
    }

    #[test]
    fn the_primary_crashes_without_a_last_word() {
        let (lab, _d) = lab();
        let mut fake = Fake::default();
        assert!(matches!(
            lab.kill_ha_primary(&mut fake),
            Err(LabError::NotUp { .. })
        ));
        fake.netns = vec!["fs-u-r1".into(), "fs-u-r2".into()];
        fake.pids = "11\n12\n".into();
        lab.kill_ha_primary(&mut fake).unwrap();
        let l: Vec<String> = lines(&fake.ran)
            .into_iter()
            .filter(|l| !l.starts_with("ip netns list") && !l.starts_with("ip netns pids"))
            .collect();
        assert_eq!(
            l,
            [
                "kill -STOP 11 12",
                "ip -n fs-u-r1 link set fs-ri down",
                "ip -n fs-u-r1 link set fs-ro down",
                "ip -n fs-u-r1 link set fs-rs down",
                "kill -KILL 11 12",
            ]
        );
    }

    #[test]
    fn kernel_ha_needs_the_lab_and_down_removes_the_routers() {
        let (lab, _d) = lab();
        let mut fake = Fake::default();
        assert!(matches!(
            lab.kernel_ha(&mut fake, true),
            Err(LabError::NotUp { .. })
        ));
        // Off when there is none: nothing but a look.
        fake.ran.clear();
        lab.kernel_ha(&mut fake, false).unwrap();
        assert_eq!(lines(&fake.ran), ["ip netns list"]);
        fake.listen = true;
        lab.up(&mut fake).unwrap();
        fake.netns.extend([
            "fs-u-r1".to_owned(),
            "fs-u-r2".to_owned(),
            "fs-u-r3".to_owned(),
        ]);
        fake.pids = "77\n".into();
        lab.down(&mut fake).unwrap();
        assert_eq!(
            fake.netns,
            vec!["fs-u-r3".to_owned()],
            "not a router of this lab"
        );
        assert!(lines(&fake.ran).contains(&"kill -KILL 77".to_owned()));
    }

    #[test]
    fn the_failover_gap_is_the_silence_after_the_crash() {
        let out = "PING 198.51.100.2 (198.51.100.2) 56(84) bytes of data.\n\
                   [100.000000] 64 bytes from 198.51.100.2: icmp_seq=1 ttl=63 time=0.1 ms\n\
                   [100.010000] 64 bytes from 198.51.100.2: icmp_seq=2 ttl=63 time=0.1 ms\n\
                   [100.020500] 64 bytes from 198.51.100.2: icmp_seq=3 ttl=63 time=0.1 ms\n\
                   From 10.0.0.2 icmp_seq=4 Destination Host Unreachable\n\
                   [100.400000] 64 bytes from 198.51.100.2: icmp_seq=40 ttl=63 time=0.1 ms\n\
                   [100.410000] 64 bytes from 198.51.100.2: icmp_seq=41 ttl=63 time=0.1 ms\n\
                   \n--- 198.51.100.2 ping statistics ---\n";
        let t = ping_reply_times(out);
        assert_eq!(t.len(), 5);
        let gap = failover_gap(&t, 100.015).unwrap();
        assert!((gap.as_secs_f64() - 0.385).abs() < 1e-6, "{gap:?}");
        // A reply in flight at the crash does not end the gap.
        let gap = failover_gap(&t, 100.020).unwrap();
        assert!((gap.as_secs_f64() - 0.380).abs() < 1e-6, "{gap:?}");
        assert_eq!(failover_gap(&t, 99.0), None, "no reply before");
        assert_eq!(failover_gap(&t, 101.0), None, "none after");
    }
}
