//! `flowstate cluster up|down|status|scale|drain|kill`: a root, a controller and NF instances
//! in the lab's namespaces ([`flowstate_cluster`]), the roles of [`crate::roles`] started as
//! `cluster root|instance|controller` (hidden: the same roles with the lab's files and
//! addresses); `status`, `scale` and `drain` also reach a controller started on its own
//! (`--socket`); `cluster key` manages key files ([`crate::key`]).
//!
//! Everything a cluster leaves on the machine lives under the lab's state directory,
//! `/run/flowstate-lab/{prefix}/cluster/`: each process's pid file, command line (checked
//! before its pid is signalled) and log, the lab's key file (`cluster.key`), the root's and
//! the instances' counters (`root.json`, `instance-K.json`), the controller's command socket
//! and, with `store = "managed"`, the store's data.

use crate::roles::{self, Deployment};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use flowstate_cluster::StoreMode;
use flowstate_cluster::{request, Command, Launcher, Status};
use flowstate_deploy::config::BackendKind;
use flowstate_lab::Lab;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Options of `flowstate cluster`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  flowstate lab up --instances 4\n  \
                        flowstate cluster up examples/cluster.toml\n  flowstate cluster status")]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    action: Action,
    /// The lab's prefix (its namespaces `{prefix}nf`, `{prefix}i1`, ...).
    #[arg(long, global = true, default_value = "fs-")]
    prefix: String,
    /// The command socket of a controller started on its own (`flowstate controller
    /// --socket`), for status, scale and drain; default: the lab's.
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Start what is not running yet: the store (`store = "managed"`), the controller (which
    /// starts the instances) and the root; wait until every partition has an owner.
    #[command(
        after_help = "Examples:\n  flowstate cluster up examples/cluster.toml\n  \
                            flowstate cluster up examples/cluster-stages.toml --timeout 120"
    )]
    Up {
        /// The deployment: `[input]`/`[output]` are the root's ports, `[state]` the shared
        /// store, `[[chain]]` what the instances run, `[cluster]` the rest.
        config: PathBuf,
        /// How long to wait for the cluster to be ready, seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Stop every process of the cluster.
    #[command(
        after_help = "Examples:\n  flowstate cluster down\n  flowstate cluster down --prefix lab2-"
    )]
    Down,
    /// The instances (id, pid, state, partitions, load) and the root's counters.
    #[command(
        after_help = "Examples:\n  flowstate cluster status\n  flowstate cluster status --json\n  \
                            flowstate cluster status --controller 192.0.2.2:9465   (flowstate controller --metrics)"
    )]
    Status {
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Ask the controller's listener (`flowstate controller --metrics ADDR`,
        /// `/api/v1/cluster`) instead of its command socket: from any host.
        #[arg(long)]
        controller: Option<std::net::SocketAddr>,
    },
    /// Run N instances in a stage (start new ones, or drain the newest).
    #[command(after_help = "Examples:\n  flowstate cluster scale 3\n  \
                            flowstate cluster scale 3 --stage 1   (the second stage's pool)")]
    Scale {
        /// Instances.
        n: u32,
        /// The chain stage whose pool to scale.
        #[arg(long, default_value_t = 0)]
        stage: u32,
    },
    /// Move every partition off instance ID, then stop it.
    #[command(
        after_help = "Examples:\n  flowstate cluster drain 2   (see flowstate cluster status for the ids)"
    )]
    Drain {
        /// The instance.
        id: u32,
    },
    /// Kill instance ID as a crash would (SIGKILL): its partitions fail over.
    #[command(
        after_help = "Examples:\n  flowstate cluster kill 1   (then flowstate cluster status shows the failover)"
    )]
    Kill {
        /// The instance.
        id: u32,
    },
    /// Manage the key file every datagram between the roles is signed and checked with.
    #[command(
        after_help = "Examples:\n  flowstate cluster key new /etc/flowstate/cluster.key\n  \
                            flowstate cluster key add /etc/flowstate/cluster.key   (a rotation's first step)"
    )]
    Key {
        #[command(subcommand)]
        action: crate::key::KeyAction,
    },
    /// The root (started by `up`).
    #[command(hide = true)]
    Root {
        /// The deployment.
        config: PathBuf,
    },
    /// An instance (started by the controller).
    #[command(hide = true)]
    Instance {
        /// The deployment.
        config: PathBuf,
        /// Its id.
        #[arg(long)]
        id: u32,
        /// The chain stage it runs.
        #[arg(long, default_value_t = 0)]
        stage: u32,
    },
    /// The controller (started by `up`).
    #[command(hide = true)]
    Controller {
        /// The deployment.
        config: PathBuf,
        /// Forget a stored assignment (a new deployment, no instance running).
        #[arg(long)]
        fresh: bool,
    },
}

/// Where a cluster keeps its files.
struct Dir {
    lab: Lab,
    path: PathBuf,
    /// The controller's command socket, when not the lab's.
    socket: Option<PathBuf>,
}

impl Dir {
    fn new(prefix: &str, socket: Option<PathBuf>) -> Result<Dir> {
        let lab = Lab::new(prefix)?;
        let path = lab.state_dir().join("cluster");
        Ok(Dir { lab, path, socket })
    }

    /// Whether the lab is routed (`lab up --routed`): its router's namespace exists.
    fn routed(&self) -> bool {
        Path::new("/run/netns")
            .join(self.lab.cluster_router_ns())
            .exists()
    }
    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.file("control.sock"))
    }
    /// The running process of `role`, as its pid file records it: a pid whose command line
    /// is still the one started (`{role}.cmdline`; a reused pid is not ours to signal).
    fn pid(&self, role: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.file(&format!("{role}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let argv = std::fs::read_to_string(self.file(&format!("{role}.cmdline"))).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (flowstate_lab::running(pid) && runs(&argv, &cmdline)).then_some(pid)
    }

    /// Whether the process `role`'s pid file names still runs, whatever it runs yet (a role
    /// just started may still be `ip netns exec` on a loaded machine): for waiting on it, not
    /// for signalling it ([`Dir::pid`]).
    fn started(&self, role: &str) -> bool {
        std::fs::read_to_string(self.file(&format!("{role}.pid")))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .is_some_and(flowstate_lab::running)
    }

    /// The key file of a lab cluster whose deployment names none (`cluster up` makes it).
    fn key_file(&self) -> PathBuf {
        self.file("cluster.key")
    }
}

/// SIGKILL, and wait (at most 2 s) until the process is gone: its sockets are free then.
fn kill_and_wait(pid: u32) {
    signal(pid, libc::SIGKILL);
    flowstate_lab::wait_stopped(pid, Duration::from_secs(2));
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: sends a signal to a process id read from our own pid files.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Starts `argv` in namespace `ns` as its own session (it outlives whoever started it), output
/// to `log`; records its pid as `role`.
fn spawn(dir: &Dir, ns: &str, role: &str, argv: &[String]) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(&dir.path)?;
    let log = std::fs::File::create(dir.file(&format!("{role}.log")))?;
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting the {role} in namespace {ns}"))?;
    // The pid, and the command line it runs (`ip netns exec` becomes the command), checked
    // before the pid is signalled.
    std::fs::write(dir.file(&format!("{role}.cmdline")), argv.join("\n"))?;
    std::fs::write(dir.file(&format!("{role}.pid")), child.id().to_string())?;
    // Until `ip` has exec'd, the child still has this process's command line: wait, so the
    // pid file is good once this returns (or the process is gone).
    let deadline = Instant::now() + Duration::from_secs(2);
    while dir.pid(role).is_none() && flowstate_lab::running(child.id()) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(child)
}

fn exe() -> Result<String> {
    Ok(std::env::current_exe()
        .context("finding this binary")?
        .to_string_lossy()
        .into_owned())
}

pub(crate) fn run(a: &ClusterArgs) -> Result<()> {
    if let Action::Key { action } = &a.action {
        return crate::key::run(action);
    }
    let dir = Dir::new(&a.prefix, a.socket.clone())?;
    match &a.action {
        Action::Up { config, timeout } => up(&dir, config, Duration::from_secs(*timeout)),
        Action::Down => down(&dir),
        Action::Status { json, controller } => status(&dir, *json, *controller),
        Action::Scale { n, stage } => {
            let v = request(
                &dir.socket(),
                &Command::Scale {
                    n: *n,
                    stage: *stage,
                },
            )?;
            println!(
                "cluster {}: scaling stage {stage} to {n} instances ({v})",
                a.prefix
            );
            Ok(())
        }
        Action::Drain { id } => {
            request(&dir.socket(), &Command::Drain { id: *id })?;
            println!("cluster {}: draining instance {id}", a.prefix);
            Ok(())
        }
        Action::Kill { id } => {
            let s = current_status(&dir)?;
            if !s.instances.iter().any(|i| i.id == *id) {
                bail!(
                    "no instance {id}; instances: {:?}",
                    s.instances.iter().map(|i| i.id).collect::<Vec<_>>()
                );
            }
            // Only a process this lab started (its pid file), never a pid from the network.
            let Some(pid) = dir.pid(&format!("instance-{id}")) else {
                bail!("instance {id} has no running process that this lab started");
            };
            signal(pid, libc::SIGKILL);
            println!("cluster {}: killed instance {id} (pid {pid})", a.prefix);
            Ok(())
        }
        Action::Key { .. } => unreachable!("handled above"),
        Action::Root { config } => roles::root(config, &files(&dir, "root.json", config)?),
        Action::Instance { config, id, stage } => {
            if !(1..=flowstate_lab::MAX_INSTANCES).contains(id) {
                bail!(
                    "--id: the lab's instances are numbered 1 to {}",
                    flowstate_lab::MAX_INSTANCES
                );
            }
            let f = files(&dir, &format!("instance-{id}.json"), config)?;
            roles::instance(config, *id, *stage, flowstate_lab::instance_addr(*id), &f)
        }
        Action::Controller { config, fresh } => role_controller(&dir, config, *fresh),
    }
}

fn up(dir: &Dir, path: &Path, timeout: Duration) -> Result<()> {
    let d = Deployment::load(path)?;
    let config_arg = std::fs::canonicalize(path)?.to_string_lossy().into_owned();
    let nf = dir.lab.nf_ns();
    let present = flowstate_lab::Lab::in_ns(&nf, &["true"]);
    if !std::process::Command::new(&present[0])
        .args(&present[1..])
        .status()
        .is_ok_and(|s| s.success())
    {
        bail!(
            "no lab {}: run `flowstate lab up --instances N` first",
            dir.lab.prefix()
        );
    }
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let have = (1..=flowstate_lab::MAX_INSTANCES)
        .take_while(|&k| {
            let ns = dir.lab.instance_ns(k);
            listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns.as_str()))
        })
        .count() as u32;
    let pools = (0..d.config.stages()).map(|k| d.section.stage(k));
    let (starts, most) = pools.fold((0, 0), |(a, b), st| {
        (
            a + st.instances + st.standby,
            b + st.max_instances + st.standby,
        )
    });
    if have < starts {
        bail!(
            "the lab {} has {have} instance namespaces and the deployment starts {starts}: run `flowstate lab up --instances {}`",
            dir.lab.prefix(),
            most.min(flowstate_lab::MAX_INSTANCES).max(starts)
        );
    }
    if d.section.address() != flowstate_lab::ROOT_ADDR {
        bail!(
            "{}: cluster.address: the lab's cluster network has the root at {}",
            path.display(),
            flowstate_lab::ROOT_ADDR
        );
    }
    std::fs::create_dir_all(&dir.path)?;
    if d.section.key_file.is_none() && !d.section.unauthenticated && !dir.key_file().exists() {
        crate::key::run(&crate::key::KeyAction::New {
            file: dir.key_file(),
        })?;
    }
    let exe = exe()?;
    // A routed lab (`lab up --routed`): its store has a namespace of its own.
    let routed = dir.routed();
    let instances_running =
        (1..=flowstate_lab::MAX_INSTANCES).any(|k| dir.pid(&format!("instance-{k}")).is_some());
    if d.section.store == StoreMode::Managed && dir.pid("store").is_none() {
        start_store(dir, &d, &exe, path, routed)?;
    }
    if dir.pid("controller").is_none() {
        let mut argv = vec![
            exe.clone(),
            "cluster".into(),
            "controller".into(),
            config_arg.clone(),
        ];
        argv.extend(["--prefix".into(), dir.lab.prefix().into()]);
        if !instances_running {
            argv.push("--fresh".into());
        }
        spawn(dir, &nf, "controller", &argv)?;
    }
    if dir.pid("root").is_none() {
        let argv = vec![
            exe,
            "cluster".into(),
            "root".into(),
            config_arg,
            "--prefix".into(),
            dir.lab.prefix().into(),
        ];
        spawn(dir, &nf, "root", &argv)?;
    }
    // Ready: the controller answers, every partition is owned, and the root moves nothing.
    let deadline = Instant::now() + timeout;
    loop {
        let ready = current_status(dir).ok().filter(Status::ready);
        let root = read_json(&dir.file("root.json"));
        // The counters of the root running now (a killed root's file stays behind).
        let root_pid = dir.pid("root");
        let root_ready = |s: &Status| {
            root.as_ref().is_some_and(|r| {
                root_pid.is_some_and(|p| r["pid"].as_u64() == Some(u64::from(p)))
                    && r["moving"].as_u64() == Some(0)
                    && s.stages.iter().all(|st| {
                        r["assignment_versions"][st.stage as usize].as_u64() >= Some(st.version)
                    })
            })
        };
        if let Some(s) = ready.as_ref().filter(|s| root_ready(s)) {
            let stages: Vec<String> = s
                .stages
                .iter()
                .map(|st| {
                    let live = s
                        .instances
                        .iter()
                        .filter(|i| i.stage == st.stage && i.state == "live")
                        .count();
                    format!(
                        "stage {}: {live} instances, {} partitions, assignment v{}",
                        st.stage, st.partitions, st.version
                    )
                })
                .collect();
            println!("cluster {}: up: {}", dir.lab.prefix(), stages.join("; "));
            return Ok(());
        }
        for role in ["controller", "root"] {
            if !dir.started(role) {
                bail!(
                    "the {role} exited: {}",
                    tail(&dir.file(&format!("{role}.log")))
                );
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster was not ready within {} s; controller log: {}; root log: {}",
                timeout.as_secs(),
                tail(&dir.file("controller.log")),
                tail(&dir.file("root.log"))
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Starts the managed store with the credentials `[state]` names, or the lab's own (made
/// here; the roles are given them): our store with its token (`--token-file`), Redis with a
/// password (`requirepass` in a configuration file of mode 0600) and its protected mode on.
/// It runs in the nf namespace at the root's address, or in a `routed` lab in the store's
/// namespace at [`flowstate_lab::STORE_ADDR`].
fn start_store(dir: &Dir, d: &Deployment, exe: &str, path: &Path, routed: bool) -> Result<()> {
    let (a, ns, host) = if routed {
        (
            flowstate_lab::STORE_ADDR,
            dir.lab.store_ns(),
            format!(
                " (the routed lab {} runs its store on a host of its own, {})",
                dir.lab.prefix(),
                dir.lab.store_ns()
            ),
        )
    } else {
        (d.section.address(), dir.lab.nf_ns(), String::new())
    };
    let url = d.config.state.url.clone().unwrap_or_default();
    // The secret: `[state]`'s, else the lab's (kept across `up`s while the store's data is).
    let (key, lab_file) = store_secret(dir, d).context("a managed store")?;
    let secret = match configured_secret(d, key)? {
        Some(s) => s,
        None => match std::fs::read_to_string(&lab_file) {
            Ok(s) if !s.trim().is_empty() => s.trim().to_owned(),
            _ => {
                let s = flowstate_cluster::auth::random_secret()?;
                crate::key::write_private(&lab_file, &format!("{s}\n"))?;
                s
            }
        },
    };
    match d.config.state.backend {
        BackendKind::Store => {
            let want = format!("{a}:7878");
            if url.trim_start_matches("tcp://") != want {
                bail!("{}: state.url: a managed store listens at {want}{host}; set url = \"{want}\"", path.display());
            }
            let data = dir.file("store-data");
            std::fs::create_dir_all(&data)?;
            let token = dir.file("store-server.token");
            crate::key::write_private(&token, &format!("{secret}\n"))?;
            let argv = vec![
                exe.to_owned(),
                "store".into(),
                "--listen".into(),
                want,
                "--data-dir".into(),
                data.to_string_lossy().into_owned(),
                "--token-file".into(),
                token.to_string_lossy().into_owned(),
            ];
            spawn(dir, &ns, "store", &argv)?;
        }
        BackendKind::Redis => {
            let want = format!("redis://{a}:6379");
            if url.trim_end_matches('/') != want {
                bail!("{}: state.url: a managed Redis listens at {want}{host}; set url = \"{want}\"", path.display());
            }
            let conf = dir.file("redis.conf");
            crate::key::write_private(
                &conf,
                &format!(
                    "bind {a}\nport 6379\nprotected-mode yes\nrequirepass {secret}\nsave \"\"\nappendonly no\ndir {}\n",
                    dir.path.display()
                ),
            )?;
            let argv = vec!["redis-server".to_owned(), conf.to_string_lossy().into_owned()];
            spawn(dir, &ns, "store", &argv)
                .context("starting redis-server (scripts/redis installs it)")?;
        }
        other => bail!(
            "{}: cluster.store: \"managed\" starts a store or a Redis; for {other:?} use store = \"external\"",
            path.display()
        ),
    }
    Ok(())
}

fn down(dir: &Dir) -> Result<()> {
    let mut roles = vec!["root".to_owned(), "controller".to_owned()];
    roles.extend((1..=flowstate_lab::MAX_INSTANCES).map(|k| format!("instance-{k}")));
    roles.push("store".into());
    let mut stopped = 0;
    for role in &roles {
        let Some(pid) = dir.pid(role) else { continue };
        signal(pid, libc::SIGTERM);
        if !flowstate_lab::wait_stopped(pid, Duration::from_secs(3)) {
            signal(pid, libc::SIGKILL);
        }
        stopped += 1;
    }
    if dir.path.exists() {
        std::fs::remove_dir_all(&dir.path)
            .with_context(|| format!("removing {}", dir.path.display()))?;
    }
    println!(
        "cluster {}: down ({stopped} processes stopped)",
        dir.lab.prefix()
    );
    Ok(())
}

fn current_status(dir: &Dir) -> Result<Status> {
    let v = request(&dir.socket(), &Command::Status)?;
    Ok(serde_json::from_value(v)?)
}

fn status(dir: &Dir, json: bool, controller: Option<std::net::SocketAddr>) -> Result<()> {
    let s = match controller {
        None => current_status(dir)?,
        Some(addr) => {
            let r =
                flowstate_telemetry::client::get(addr, "/api/v1/cluster", Duration::from_secs(5))
                    .with_context(|| format!("asking the controller's listener at {addr}"))?;
            if r.status != 200 {
                bail!(
                    "{addr}/api/v1/cluster: HTTP {}: is it a controller's --metrics listener?",
                    r.status
                );
            }
            serde_json::from_str(&r.text()).with_context(|| format!("{addr}/api/v1/cluster"))?
        }
    };
    let root = read_json(&dir.file("root.json"));
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["root"] = root.unwrap_or(serde_json::Value::Null);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match &s.leader {
        Some(l) if l.me => println!(
            "controller {} at {}: leading, term {}",
            l.index, l.address, l.term
        ),
        Some(l) => println!(
            "this controller stands by; leader: controller {} at {}, term {}",
            l.index, l.address, l.term
        ),
        None => println!("this controller stands by; no leader known yet"),
    }
    for st in &s.stages {
        println!(
            "cluster {} stage {}: assignment v{}, {} partitions, target {} instances",
            dir.lab.prefix(),
            st.stage,
            st.version,
            st.partitions,
            st.target
        );
    }
    println!(
        "{:>3} {:>5} {:>8} {:<9} {:>5} {:>10} {:>8} {:>8}  partitions",
        "id", "stage", "pid", "state", "load", "packets", "drops", "entries"
    );
    for i in &s.instances {
        println!(
            "{:>3} {:>5} {:>8} {:<9} {:>5.2} {:>10} {:>8} {:>8}  {:?}",
            i.id, i.stage, i.pid, i.state, i.load, i.packets, i.drops, i.entries, i.partitions
        );
    }
    if let Some(r) = &root {
        println!(
            "root: {} received, {} out, moves {} (p50 {} ms), held {}, lost on move {}, reordered {}",
            r["received"], r["from_instances"], r["moves_done"], r["move_ms_p50"], r["held"],
            r["hold_dropped"], r["reordered"]
        );
        println!(
            "root fast path: {} packets, {} entries learnt, {} moved out",
            r["fast_path_packets"], r["fast_path_learned"], r["fast_path_moved_out"]
        );
    }
    let refused = |m: &serde_json::Value| -> String {
        match m.as_object().filter(|m| !m.is_empty()) {
            Some(m) => m
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            None => "none".into(),
        }
    };
    println!(
        "datagrams refused: controller {}; root {}",
        refused(&serde_json::to_value(&s.auth_rejected)?),
        root.as_ref()
            .map_or("-".into(), |r| refused(&r["auth_rejected"]))
    );
    Ok(())
}

/// Whether a process whose `/proc/PID/cmdline` is `cmdline` runs the command `argv` (one
/// argument a line) was started with: its arguments end with `argv`'s (`ip netns exec NS`
/// until it becomes the command), or it rewrote its title (redis-server: one string, padded
/// with NULs) and the title begins with the program's name.
fn runs(argv: &str, cmdline: &[u8]) -> bool {
    let started: Vec<&[u8]> = argv.lines().map(str::as_bytes).collect();
    let end = cmdline.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let now: Vec<&[u8]> = cmdline[..end].split(|&b| b == 0).collect();
    let retitled = now.len() == 1
        && now[0].contains(&b' ')
        && started.first().is_some_and(|p| now[0].starts_with(p));
    !started.is_empty() && (now.ends_with(&started) || retitled)
}

/// Starts instances in their lab namespaces. In a routed lab each namespace stands for a host
/// of its own, and the launcher acts as that host's supervisor would (`systemctl start
/// flowstate-instance@N`): it starts an instance only where none runs, and never kills a
/// failed one (the store fences it; it rejoins when its host is back).
struct NamespaceLauncher<'a> {
    dir: &'a Dir,
    exe: String,
    config: String,
    children: HashMap<u32, Child>,
    routed: bool,
}

impl NamespaceLauncher<'_> {
    fn pid(&self, id: u32) -> Option<u32> {
        self.dir.pid(&format!("instance-{id}"))
    }
    /// Collects the exit status of children that ended (no zombies).
    fn reap_exited(&mut self) {
        self.children
            .retain(|_, c| !matches!(c.try_wait(), Ok(Some(_))));
    }
}

impl Launcher for NamespaceLauncher<'_> {
    fn start(&mut self, stage: u32, id: u32) -> std::io::Result<u32> {
        self.reap_exited();
        if !(1..=flowstate_lab::MAX_INSTANCES).contains(&id) {
            return Err(std::io::Error::other(format!(
                "instance {id}: the lab has at most {} instance namespaces",
                flowstate_lab::MAX_INSTANCES
            )));
        }
        if let Some(pid) = self.pid(id) {
            if self.routed {
                return Ok(pid); // it runs on its host: the supervisor has nothing to start
            }
            kill_and_wait(pid); // a stale process of this id must not act for it
        }
        let ns = self.dir.lab.instance_ns(id);
        let argv = vec![
            self.exe.clone(),
            "cluster".into(),
            "instance".into(),
            self.config.clone(),
            "--prefix".into(),
            self.dir.lab.prefix().into(),
            "--id".into(),
            id.to_string(),
            "--stage".into(),
            stage.to_string(),
        ];
        let child = spawn(self.dir, &ns, &format!("instance-{id}"), &argv).map_err(|e| {
            std::io::Error::other(format!(
                "{e:#} (is the lab up with --instances {id} or more?)"
            ))
        })?;
        let pid = child.id();
        self.children.insert(id, child);
        Ok(pid)
    }

    fn stop(&mut self, id: u32) {
        if let Some(pid) = self.pid(id) {
            signal(pid, libc::SIGTERM);
        }
        self.reap_exited();
    }

    fn reap(&mut self, id: u32) {
        match self.pid(id) {
            Some(_) if self.routed => {
                tracing::info!(
                    id,
                    "a failed instance on a host of its own: fenced, not killed"
                )
            }
            Some(pid) => kill_and_wait(pid),
            None => {}
        }
        self.reap_exited();
    }
}

fn role_controller(dir: &Dir, path: &Path, fresh: bool) -> Result<()> {
    let mut d = Deployment::load(path)?;
    d.use_secret(store_secret(dir, &d).as_ref());
    let mut launcher = NamespaceLauncher {
        dir,
        exe: exe()?,
        config: std::fs::canonicalize(path)?.to_string_lossy().into_owned(),
        children: HashMap::new(),
        routed: dir.routed(),
    };
    roles::controller(
        &d,
        &dir.socket(),
        fresh,
        Some(&dir.key_file()),
        None,
        &mut launcher,
    )
}

/// What a role of this lab writes where.
fn files(dir: &Dir, stats: &str, path: &Path) -> Result<roles::Files> {
    let d = Deployment::load(path)?;
    Ok(roles::Files {
        stats: Some(dir.file(stats)),
        lab_key: Some(dir.key_file()),
        store_secret: store_secret(dir, &d),
    })
}

/// The managed store's secret when the deployment names none: the lab's (a `[state]` key and
/// its file, made by `up`).
fn store_secret(dir: &Dir, d: &Deployment) -> Option<(&'static str, PathBuf)> {
    if d.section.store != StoreMode::Managed {
        return None;
    }
    match d.config.state.backend {
        BackendKind::Store => Some(("token_file", dir.file("store.token"))),
        BackendKind::Redis => Some(("password_file", dir.file("redis.password"))),
        _ => None,
    }
}

/// The first line of the secret `[state]` names as `key` (inline or a file).
fn configured_secret(d: &Deployment, key: &str) -> Result<Option<String>> {
    let o = &d.config.state.options;
    if key == "token_file" {
        if let Some(t) = o.get("token").and_then(|v| v.as_str()) {
            return Ok(Some(t.to_owned()));
        }
    }
    let Some(file) = o.get(key).and_then(|v| v.as_str()) else {
        return Ok(None);
    };
    let text = flowstate_config::read_text(file).with_context(|| format!("state.{key}: {file}"))?;
    Ok(text.lines().next().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn a_pid_is_ours_only_while_it_runs_the_command_started() {
        let argv = "redis-server\n/run/lab/cluster/redis.conf\n";
        // As started, through `ip netns exec`.
        let exec = b"ip\0netns\0exec\0fs-st\0redis-server\0/run/lab/cluster/redis.conf\0";
        assert!(runs(argv, exec));
        assert!(runs(argv, b"redis-server\0/run/lab/cluster/redis.conf\0"));
        // Retitled by redis-server itself: one string padded with NULs.
        let mut title = b"redis-server 192.0.2.1:6379".to_vec();
        title.resize(61, 0);
        assert!(runs(argv, &title));
        // A reused pid: another program, or the same one with other arguments.
        assert!(!runs(argv, b"sleep\x00100\x00"));
        assert!(!runs(argv, b"redis-server\0/etc/redis/redis.conf\0"));
        assert!(!runs(argv, b"nginx: worker process\0\0\0"));
        assert!(!runs("", b"redis-server 1:2\0"));
        assert!(!runs(argv, b""));
    }
}
