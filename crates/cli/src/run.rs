//! `flowstate run CONFIG.toml`: runs a chain of NFs as a configuration file describes, and
//! prints what happened.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use flowstate_deploy::config::{Input, MAX_WORKERS};
use flowstate_deploy::reload::Reloader;
use flowstate_deploy::run_config_observed;
use flowstate_deploy::Plan;
use std::path::PathBuf;
use std::sync::Arc;

/// Options of `flowstate run`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  flowstate run examples/nat.toml\n  \
                        flowstate run examples/portscan.toml --workers 2 --json --eve eve.json\n  \
                        ip netns exec fs-nf flowstate run examples/live-nat.toml --metrics 9464")]
pub(crate) struct RunArgs {
    /// The configuration file (TOML). Relative paths in it are relative to the current
    /// directory.
    pub(crate) config: PathBuf,
    /// Print the summary as one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Number of workers, overriding `[runtime] workers`.
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    /// Append the NFs' alerts (portscan, trojan) to this file as EVE JSON lines, as
    /// Suricata's `eve.json`.
    #[arg(long, value_name = "FILE")]
    pub(crate) eve: Option<PathBuf>,
    /// Serve Prometheus metrics (`/metrics`) and the run's summary so far
    /// (`/api/v1/summary`) on this address while running, overriding `[telemetry] listen`:
    /// `HOST:PORT`, or a port alone for loopback (`--metrics 9464`). Example:
    /// `flowstate run box.toml --metrics 127.0.0.1:9464`, then `curl -s 127.0.0.1:9464/metrics`.
    #[arg(long, value_name = "ADDR", value_parser = flowstate_telemetry::parse_listen)]
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

/// Runs the configuration and prints the summary on stdout (text, or JSON with `--json`).
/// Progress goes to stderr on a terminal only.
pub(crate) fn run(args: &RunArgs) -> Result<()> {
    let loaded = crate::check::load(&args.config)?;
    let mut config = loaded.config;
    if let Some(w) = args.workers {
        if !(1..=MAX_WORKERS).contains(&w) {
            bail!("--workers: expected 1 to {MAX_WORKERS}, got {w}");
        }
        config.runtime.workers = w;
    }
    let total = match &config.input {
        Input::Synthetic(s) => s.config.packets,
        Input::Pcap(_) | Input::Interface(_) => 0,
    };
    let bar = crate::progress(total, "run");
    let progress = |n: u64| bar.inc(n);
    let connector = crate::backends::connect(&config.file, &config.state, loaded.backend)?;
    let listen = args.metrics.or(config.telemetry.listen);
    match config.plan() {
        Plan::Cluster => bail!(
            "{}: [cluster]: this deployment runs as a cluster: `flowstate cluster up {}` (in a lab with instance namespaces)",
            args.config.display(),
            args.config.display()
        ),
        #[cfg(target_os = "linux")]
        Plan::LivePipeline { inside, outside } => {
            use flowstate_router::Stop;
            if let Err(e) = Stop::on_signals() {
                tracing::warn!("cannot catch SIGINT/SIGTERM: {e}");
            }
            let published = std::sync::Arc::new(arc_swap::ArcSwapOption::empty());
            let server = match listen {
                Some(addr) => {
                    let provider = crate::telemetry::PipelineProvider(published.clone());
                    Some(crate::telemetry::serve(
                        addr,
                        std::sync::Arc::new(provider),
                        config.telemetry.token_file.as_deref(),
                    )?)
                }
                None => None,
            };
            let summary = flowstate_deploy::live_pipeline::run_pipeline_live(
                &config,
                connector,
                inside,
                outside,
                Stop::new(),
                server.is_some().then_some(&*published),
            );
            if let Some(s) = server {
                s.stop();
            }
            bar.finish_and_clear();
            return print_summary(&summary?, args.json);
        }
        #[cfg(not(target_os = "linux"))]
        Plan::LivePipeline { .. } => bail!("a live box runs on Linux only"),
        Plan::Pipeline => {
            if let Some(a) = listen {
                tracing::warn!(
                    addr = %a,
                    "an offline [fastpath] run exports no metrics (it ends when its input does); \
                     no listener"
                );
            }
            let summary =
                flowstate_deploy::pipeline::run_pipeline(&config, connector, Some(&progress));
            bar.finish_and_clear();
            return print_summary(&summary?, args.json);
        }
        Plan::LiveBox { .. } | Plan::Offline => {}
    }
    // A live box reloads its file on SIGHUP and `flowstate reload`.
    let reload = matches!(config.plan(), Plan::LiveBox { .. })
        .then(|| Arc::new(flowstate_chain::reload::Reload::default()));
    let reloader = match &reload {
        Some(r) => {
            let reloader = Reloader::new(&config, &loaded.text, Arc::clone(r))
                .map_err(|e| anyhow!(e.join("\n")))?;
            let reloader = Arc::new(reloader);
            reload_on_sighup(Arc::clone(&reloader))?;
            Some(reloader)
        }
        None => None,
    };
    let (observer, server) = match listen {
        Some(addr) => {
            let observer = flowstate_chain::observe::Observer::new();
            let provider = Arc::new(crate::telemetry::ChainProvider {
                observer: Arc::clone(&observer),
                reloader,
            });
            (
                Some(observer),
                Some(crate::telemetry::serve(
                    addr,
                    provider,
                    config.telemetry.token_file.as_deref(),
                )?),
            )
        }
        None => (None, None),
    };
    let summary = run_config_observed(&config, connector, Some(&progress), observer, reload);
    if let Some(s) = server {
        s.stop();
    }
    bar.finish_and_clear();
    print_summary(&summary?, args.json)
}

/// Reloads with `reloader` whenever the process gets SIGHUP (as nginx or HAProxy do), on a
/// thread of its own; the outcome goes to the log.
fn reload_on_sighup(reloader: Arc<Reloader>) -> Result<()> {
    on_sighup(move || {
        let _ = crate::telemetry::reload_answer(&reloader);
    })
}

/// Makes SIGHUP harmless to a process that reloads nothing (a cluster role, a store server):
/// logged that `what` reads its configuration at start only, where it would have ended it.
pub(crate) fn ignore_sighup(what: &'static str) -> Result<()> {
    on_sighup(move || {
        tracing::warn!(
            "SIGHUP: {what} reads its configuration at start only (nothing reloaded); \
             restart it to apply a change"
        );
    })
}

/// Runs `then` on a thread of its own at every SIGHUP.
fn on_sighup(mut then: impl FnMut() + Send + 'static) -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
        .context("cannot catch SIGHUP")?;
    std::thread::Builder::new()
        .name("sighup".into())
        .spawn(move || {
            for _ in signals.forever() {
                then();
            }
        })
        .context("cannot start the SIGHUP thread")?;
    Ok(())
}

/// Prints a run's summary: text, or one JSON object with `--json`.
fn print_summary(summary: &(impl serde::Serialize + std::fmt::Display), json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(summary)?);
    } else {
        print!("{summary}");
    }
    Ok(())
}
