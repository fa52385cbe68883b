//! `flowstate root|instance|controller CONFIG`: the cluster's three roles, each a process an
//! operator starts on a host of their choice (under systemd: `packaging/systemd/`), reading
//! the same deployment file. The lab's `cluster up` starts the same roles in its namespaces.

use crate::telemetry::{ClusterRoleProvider, CONTROLLER_GAUGES, INSTANCE_GAUGES, ROOT_GAUGES};
use anyhow::{bail, Context, Result};
use clap::Args;
use flowstate_cluster::auth::{KeyRing, Keys};
use flowstate_cluster::{
    assignment_key, run_controller, ClusterSection, ControllerOptions, Launcher,
};
use flowstate_deploy::config::{Input, Output};
use flowstate_deploy::Config;
use flowstate_router::Stop;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest instance id.
pub(crate) const MAX_ID: u32 = 65_535;

/// Options of `flowstate root`.
#[derive(Debug, Args)]
#[command(
    after_help = "The root takes the box's two ports (`[input]`, `[output]`), steers every \
    packet to the instance owning its partition over GENEVE, and sends their output on.\n\n\
    Examples:\n  flowstate root /etc/flowstate/cluster.toml\n  \
    systemctl start flowstate-root   (packaging/systemd/flowstate-root.service)"
)]
pub(crate) struct RootArgs {
    /// The deployment file.
    config: PathBuf,
    /// Write the root's counters here as JSON (every 200 ms).
    #[arg(long)]
    stats: Option<PathBuf>,
}

/// Options of `flowstate instance`.
#[derive(Debug, Args)]
#[command(
    after_help = "An instance reports to the controller (`[cluster] controller`), which \
    admits it and gives it partitions; it leaves by drain or by missing reports.\n\n\
    Examples:\n  flowstate instance /etc/flowstate/cluster.toml --id 3 --address 192.0.2.13\n  \
    systemctl start flowstate-instance@3   (packaging/systemd/flowstate-instance@.service)"
)]
pub(crate) struct InstanceArgs {
    /// The deployment file.
    config: PathBuf,
    /// Its id, unique in the cluster (1 to 65535).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_ID as i64))]
    id: u32,
    /// Its address on the cluster network (the root and the controller send to it).
    #[arg(long)]
    address: Ipv4Addr,
    /// The chain stage it runs.
    #[arg(long, default_value_t = 0)]
    stage: u32,
    /// Write its counters here as JSON (every heartbeat).
    #[arg(long)]
    stats: Option<PathBuf>,
}

/// Options of `flowstate controller`.
#[derive(Debug, Args)]
#[command(
    after_help = "The controller admits instances that report, gives each partition one \
    owner, fails over the silent ones and drains on request. It starts instances only with \
    `[cluster] start_command`.\n\n\
    Examples:\n  flowstate controller /etc/flowstate/cluster.toml\n  \
    flowstate cluster status --socket /run/flowstate/controller.sock"
)]
pub(crate) struct ControllerArgs {
    /// The deployment file.
    config: PathBuf,
    /// Its command socket (`cluster status|scale|drain --socket`).
    #[arg(long, default_value = "/run/flowstate/controller.sock")]
    socket: PathBuf,
    /// Forget a stored assignment (a new deployment, no instance running).
    #[arg(long)]
    fresh: bool,
    /// Serve its status (`/api/v1/cluster`, what `cluster status --controller ADDR` reads
    /// from any host) and metrics on this address (e.g. `0.0.0.0:9465`).
    #[arg(long, value_parser = flowstate_telemetry::parse_listen)]
    metrics: Option<std::net::SocketAddr>,
}

/// A cluster deployment file, loaded.
pub(crate) struct Deployment {
    pub(crate) config: Config,
    pub(crate) section: ClusterSection,
    /// The deployment file's directory (relative paths in it are from there).
    base: PathBuf,
}

impl Deployment {
    /// Loads `path` as `check` does; it must have `[cluster]`.
    pub(crate) fn load(path: &Path) -> Result<Deployment> {
        let loaded = crate::check::load(path)?;
        let Some(section) = loaded.config.cluster.clone() else {
            bail!(
                "{}: no [cluster] section: this is not a cluster deployment (see examples/cluster.toml)",
                path.display()
            );
        };
        let (Input::Interface(_), Output::Interface(_)) =
            (&loaded.config.input, &loaded.config.output)
        else {
            bail!("{}: input: the root needs two ports", path.display());
        };
        Ok(Deployment {
            config: loaded.config,
            section,
            base: crate::check::base_dir(path),
        })
    }

    /// Connects with `secret` (a `[state]` key and a file) unless `[state]` names credentials
    /// of its own.
    pub(crate) fn use_secret(&mut self, secret: Option<&(&'static str, PathBuf)>) {
        let o = &mut self.config.state.options;
        if let Some((key, file)) = secret {
            if !["token", "token_file", "password_file"]
                .iter()
                .any(|k| o.contains_key(*k))
            {
                o.insert((*key).into(), file.to_string_lossy().into_owned().into());
            }
        }
    }

    /// The keys of the roles: `[cluster] key_file`, else `fallback` (the lab's own key); none
    /// with `unauthenticated`.
    pub(crate) fn keys(&self, fallback: Option<&Path>) -> Result<KeyRing> {
        if self.section.unauthenticated {
            tracing::warn!("cluster.unauthenticated: datagrams between roles are not authenticated: anyone on the cluster network can steer traffic");
            return Ok(KeyRing::fixed(Keys::unauthenticated()));
        }
        let Some(path) = self
            .section
            .key_path(&self.base)
            .or_else(|| fallback.map(Path::to_path_buf))
        else {
            bail!("cluster.key_file: required: every datagram between the roles is signed with it (`flowstate cluster key new FILE`, then copy it to every host)");
        };
        KeyRing::open(&path).context("cluster.key_file")
    }
}

/// What a role writes where: its counters' file, the key to use when the deployment names
/// none (the lab's), and the lab's managed store's secret (`[state]` key and file) when the
/// deployment names none.
#[derive(Debug, Default)]
pub(crate) struct Files {
    pub(crate) stats: Option<PathBuf>,
    pub(crate) lab_key: Option<PathBuf>,
    pub(crate) store_secret: Option<(&'static str, PathBuf)>,
}

pub(crate) fn root_command(a: &RootArgs) -> Result<()> {
    root(
        &a.config,
        &Files {
            stats: a.stats.clone(),
            ..Files::default()
        },
    )
}

pub(crate) fn instance_command(a: &InstanceArgs) -> Result<()> {
    let files = Files {
        stats: a.stats.clone(),
        ..Files::default()
    };
    instance(&a.config, a.id, a.stage, a.address, &files)
}

pub(crate) fn controller_command(a: &ControllerArgs) -> Result<()> {
    let d = Deployment::load(&a.config)?;
    if let Some(dir) = a.socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut launcher = CommandLauncher {
        start: d.section.start_command.clone(),
        stop: d.section.stop_command.clone(),
        running: Vec::new(),
    };
    controller(&d, &a.socket, a.fresh, None, a.metrics, &mut launcher)
}

/// The root of the deployment at `path`, until SIGINT/SIGTERM.
pub(crate) fn root(path: &Path, files: &Files) -> Result<()> {
    let mut d = Deployment::load(path)?;
    d.use_secret(files.store_secret.as_ref());
    Stop::on_signals().context("catching SIGINT/SIGTERM")?;
    crate::run::ignore_sighup("the root")?;
    let (Input::Interface(inside), Output::Interface(outside)) =
        (&d.config.input, &d.config.output)
    else {
        unreachable!("Deployment::load checked the ports");
    };
    let keys = d.keys(files.lab_key.as_deref())?;
    // A new epoch: this root's clocks continue above every earlier root's.
    let mut store = connector_when_up(&d.config)?.connect()?;
    let epoch = flowstate_cluster::take_epoch(store.as_mut())?;
    drop(store);
    let listen = d.config.telemetry.listen;
    let (stats, _server) = stats_sink(files.stats.clone(), listen, &d.config, "root", ROOT_GAUGES)?;
    let o = flowstate_cluster::RootOptions {
        section: d.section.clone(),
        inside: inside.clone(),
        outside: outside.clone(),
        inside_prefixes: d.config.runtime.inside_prefixes(),
        stats,
        epoch,
        keys,
        max_frame: d.config.runtime.max_frame,
    };
    let stages = d.config.stage_factories()?;
    let stats = flowstate_cluster::run_root(&o, &stages, Stop::new())?;
    eprintln!("root stopped: {stats:?}");
    Ok(())
}

/// Instance `id` of stage `stage` at `address`, until SIGINT/SIGTERM.
pub(crate) fn instance(
    path: &Path,
    id: u32,
    stage: u32,
    address: Ipv4Addr,
    files: &Files,
) -> Result<()> {
    let mut d = Deployment::load(path)?;
    d.use_secret(files.store_secret.as_ref());
    let Some(chain) = d.config.stage_factories()?.into_iter().nth(stage as usize) else {
        bail!(
            "--stage: the chain has {} stage(s), numbered from 0",
            d.config.stages()
        );
    };
    let keys = d.keys(files.lab_key.as_deref())?;
    Stop::on_signals().context("catching SIGINT/SIGTERM")?;
    crate::run::ignore_sighup("an instance")?;
    let connector = connector_when_up(&d.config)?;
    let listen = d.config.telemetry.listen;
    let (stats, _server) = stats_sink(
        files.stats.clone(),
        listen,
        &d.config,
        "instance",
        INSTANCE_GAUGES,
    )?;
    let o = flowstate_cluster::ServeOptions {
        section: d.section.clone(),
        id,
        stage,
        address,
        flush_interval: d.config.state.flush_interval,
        retain_ops: d.config.state.retain_ops,
        stats,
        keys,
        max_frame: d.config.runtime.max_frame,
    };
    flowstate_cluster::run_instance(&o, chain, connector, Stop::new())?;
    Ok(())
}

/// The controller of deployment `d`, its command socket at `socket`, until SIGINT/SIGTERM.
pub(crate) fn controller(
    d: &Deployment,
    socket: &Path,
    fresh: bool,
    lab_key: Option<&Path>,
    metrics: Option<std::net::SocketAddr>,
    launcher: &mut dyn Launcher,
) -> Result<()> {
    let keys = d.keys(lab_key)?;
    Stop::on_signals().context("catching SIGINT/SIGTERM")?;
    crate::run::ignore_sighup("the controller")?;
    let connector = connector_when_up(&d.config)?;
    let mut store = connector.connect()?;
    let lease_store = connector.connect()?;
    let (stats, _server) = stats_sink(None, metrics, &d.config, "controller", CONTROLLER_GAUGES)?;
    if fresh {
        // A new cluster: no assignment, and no lease of an earlier one to wait out.
        let mut replies = Vec::new();
        let ops: Vec<_> = (0..d.config.stages())
            .map(|k| flowstate_state::Op::Delete {
                key: assignment_key(k),
            })
            .chain([flowstate_state::Op::Delete {
                key: flowstate_cluster::lease::lease_key(),
            }])
            .collect();
        store.execute(&ops, &mut replies)?;
    }
    let o = ControllerOptions {
        section: d.section.clone(),
        socket: socket.to_path_buf(),
        keys,
        stats,
    };
    run_controller(
        &o,
        store,
        lease_store,
        launcher,
        d.config.stages(),
        Stop::new(),
    )?;
    Ok(())
}

/// Where a role's stats go: its file (if any), and with `listen` (the root's and the
/// instances' `[telemetry] listen`, the controller's `--metrics`) a metrics listener (in the
/// lab, in the role's own namespace: each has its own loopback), served while the returned
/// server is kept, requiring `config`'s `[telemetry] token_file` if it names one.
fn stats_sink(
    file: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
    config: &Config,
    role: &'static str,
    gauges: &'static [&'static str],
) -> Result<(
    flowstate_cluster::StatsSink,
    Option<flowstate_telemetry::Server>,
)> {
    let mut sink = flowstate_cluster::StatsSink { file, slot: None };
    let Some(addr) = listen else {
        return Ok((sink, None));
    };
    let slot = Arc::new(arc_swap::ArcSwapOption::empty());
    let provider = ClusterRoleProvider {
        role,
        document: if role == "controller" {
            "cluster"
        } else {
            "stats"
        },
        gauges,
        slot: slot.clone(),
    };
    let provider: Arc<dyn flowstate_telemetry::Provider> = Arc::new(provider);
    let options = crate::telemetry::options(config.telemetry.token_file.as_deref())?;
    // A role restarted after a crash may find its predecessor's listener still closing (a
    // SIGKILLed root's socket outlived its process by a moment in the lab): wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let server = loop {
        match flowstate_telemetry::Server::start_with(addr, provider.clone(), options.clone()) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => break crate::telemetry::serve_started(addr, r)?,
        }
    };
    sink.slot = Some(slot);
    Ok((sink, Some(server)))
}

/// Opens the store, retrying while it starts (a managed store comes up beside the roles).
fn connector_when_up(config: &Config) -> Result<Arc<dyn flowstate_state::Connector>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = crate::backends::connector(config)
            .map_err(anyhow::Error::from)
            .and_then(|c| c.connect().map(|_| c).map_err(anyhow::Error::from));
        match attempt {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e.context("cannot reach the store")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Starts and stops instances with `[cluster] start_command` and `stop_command` (`sh -c`,
/// `{id}`, and `{stage}` in the start command, replaced); without a start command it starts
/// none (instances are started by their hosts and join). A failed instance is not killed: it
/// may be on another host; its partitions have new owners at a newer epoch.
struct CommandLauncher {
    start: Option<String>,
    stop: Option<String>,
    /// Commands still running (waited for, so none is left a zombie).
    running: Vec<Child>,
}

impl CommandLauncher {
    fn spawn(&mut self, template: &str, stage: Option<u32>, id: u32) -> std::io::Result<u32> {
        self.running
            .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        let mut cmd = template.replace("{id}", &id.to_string());
        if let Some(stage) = stage {
            cmd = cmd.replace("{stage}", &stage.to_string());
        }
        tracing::info!(id, stage, command = %cmd, "running");
        let child = std::process::Command::new("sh")
            .args(["-c", &cmd])
            .stdin(std::process::Stdio::null())
            .spawn()?;
        let pid = child.id();
        self.running.push(child);
        Ok(pid)
    }
}

impl Launcher for CommandLauncher {
    fn start(&mut self, stage: u32, id: u32) -> std::io::Result<u32> {
        match self.start.clone() {
            Some(t) => self.spawn(&t, Some(stage), id),
            None => Err(std::io::Error::other(
                "no [cluster] start_command: instances are started on their hosts",
            )),
        }
    }

    fn stop(&mut self, id: u32) {
        match self.stop.clone() {
            Some(t) => {
                if let Err(e) = self.spawn(&t, None, id) {
                    tracing::error!(id, "cannot run the stop_command: {e}");
                }
            }
            None => tracing::warn!(
                id,
                "instance drained: it owns nothing now; stop it on its host (no [cluster] stop_command)"
            ),
        }
    }

    fn reap(&mut self, id: u32) {
        tracing::warn!(
            id,
            "instance failed: not killed (it may be on another host); its partitions have new owners at a newer epoch"
        );
    }

    fn starts(&self) -> bool {
        self.start.is_some()
    }
}
