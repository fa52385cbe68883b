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

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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

/// One lab: its names and where it keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lab {
    prefix: String,
    state_dir: PathBuf,
}

/// What [`Lab::status`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The lab's namespaces that exist.
    pub namespaces: Vec<String>,
    /// The lab's servers that run: (name, pid).
    pub servers: Vec<(String, u32)>,
    /// Whether every namespace exists and every server runs.
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
        })
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

    /// The three namespaces, in the order they are made.
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

    /// The commands that remove the namespaces in `present` (those of this lab only).
    pub fn down_plan(&self, present: &[String]) -> Vec<Cmd> {
        self.namespaces()
            .iter()
            .filter(|ns| present.contains(ns))
            .map(|ns| Cmd::new(&["ip", "netns", "del", ns]).may_fail())
            .collect()
    }

    /// The commands that make (`on`) or remove Linux's own NAT in the nf namespace: the
    /// box's addresses on its ports, IPv4 forwarding, and an nftables masquerade on the
    /// outside port. Used as the benchmark's peer; flowstate must not run meanwhile.
    pub fn kernel_nat_plan(&self, on: bool) -> Vec<Cmd> {
        let n = self.nf_ns();
        let inside = format!("{BOX_INSIDE}/24");
        let outside = format!("{BOX_OUTSIDE}/24");
        if on {
            let nft = |args: &[&str]| Cmd {
                argv: Lab::in_ns(&n, &[&["nft"][..], args].concat()),
                may_fail: false,
            };
            let oif = format!("\"{NF_OUTSIDE_IF}\"");
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
                Cmd {
                    argv: Lab::in_ns(&n, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]),
                    may_fail: false,
                },
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
            ]
        } else {
            vec![
                Cmd {
                    argv: Lab::in_ns(&n, &["nft", "delete", "table", "ip", KERNEL_NAT_TABLE]),
                    may_fail: true,
                },
                Cmd {
                    argv: Lab::in_ns(&n, &["sysctl", "-qw", "net.ipv4.ip_forward=0"]),
                    may_fail: true,
                },
                Cmd::new(&["ip", "-n", &n, "addr", "flush", "dev", NF_INSIDE_IF]).may_fail(),
                Cmd::new(&["ip", "-n", &n, "addr", "flush", "dev", NF_OUTSIDE_IF]).may_fail(),
                // The client and server cached the box's MAC from flowstate's ARP answers:
                // the same MACs, so nothing to flush there.
            ]
        }
    }

    /// Which of this lab's namespaces exist.
    pub fn present(&self, exec: &mut dyn Exec) -> Result<Vec<String>, LabError> {
        let out = exec.run(&Cmd::new(&["ip", "netns", "list"]))?;
        let names: Vec<&str> = out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        Ok(self
            .namespaces()
            .into_iter()
            .filter(|ns| names.contains(&ns.as_str()))
            .collect())
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

    /// What exists of this lab.
    pub fn status(&self, exec: &mut dyn Exec) -> Result<Status, LabError> {
        let namespaces = self.present(exec)?;
        let wanted = self.servers();
        let servers: Vec<(String, u32)> = self
            .read_pids()
            .into_iter()
            .filter(|(_, pid, argv0)| exec.alive(*pid, argv0))
            .map(|(name, pid, _)| (name, pid))
            .collect();
        let complete = namespaces.len() == 3
            && wanted
                .iter()
                .all(|w| servers.iter().any(|(n, _)| n == w.name));
        Ok(Status {
            namespaces,
            servers,
            complete,
        })
    }

    /// Makes the lab (see the crate promises). Returns whether anything was made (`false`:
    /// it was already complete).
    pub fn up(&self, exec: &mut dyn Exec) -> Result<bool, LabError> {
        if self.status(exec)?.complete {
            return Ok(false);
        }
        self.down(exec)?;
        let made = self.build(exec);
        if made.is_err() {
            // Leave nothing half made.
            let _ = self.down(exec);
        }
        made.map(|()| true)
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

    /// Removes the lab (see the crate promises).
    pub fn down(&self, exec: &mut dyn Exec) -> Result<(), LabError> {
        for (_, pid, argv0) in self.read_pids() {
            if exec.alive(pid, &argv0) {
                exec.kill(pid);
            }
        }
        let present = self.present(exec)?;
        for cmd in self.down_plan(&present) {
            exec.run(&cmd)?;
        }
        match std::fs::remove_dir_all(&self.state_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LabError::Io {
                path: self.state_dir.clone(),
                source,
            }),
        }
    }

    /// Switches Linux's own NAT in the nf namespace on or off ([`Lab::kernel_nat_plan`]).
    pub fn kernel_nat(&self, exec: &mut dyn Exec, on: bool) -> Result<(), LabError> {
        if on {
            for cmd in self.kernel_nat_plan(false) {
                exec.run(&cmd)?;
            }
        }
        for cmd in self.kernel_nat_plan(on) {
            exec.run(&cmd)?;
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
             \x20           ip netns exec {c} curl http://{SERVER}:{HTTP_PORT}/backend\n",
            self.state_dir.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Records commands; `ip netns list` answers with `netns`.
    #[derive(Default)]
    struct Fake {
        ran: Vec<Cmd>,
        netns: Vec<String>,
        spawned: Vec<(Cmd, u32)>,
        killed: Vec<u32>,
        listen: bool,
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
                    Ok(String::new())
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
    }
}
