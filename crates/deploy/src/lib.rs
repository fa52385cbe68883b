//! The deployment file and the one place that decides what it runs.
//!
//! [`Config`] reads a deployment file (TOML) with every section typed, `[cluster]` included,
//! and reports every error at once, each naming the file, the key and its line.
//! [`Config::plan`] says what the file runs, and nothing else decides it:
//!
//! | the file has | it runs ([`Plan`]) |
//! |---|---|
//! | `[cluster]` | a cluster: each role (`root`, `instance`, `controller`) a process of its own |
//! | `[fastpath]` and an `interface` in `[input]` and `[output]` | HyperSFC's pipeline as a live box ([`live_pipeline`]) |
//! | `[fastpath]` | HyperSFC's pipeline over a capture or synthetic traffic ([`pipeline`]) |
//! | an `interface` in `[input]` and `[output]` | the chain as a live two-port box (`flowstate_chain::live`) |
//! | otherwise | the chain over a capture or synthetic traffic, to a capture or nowhere |
//!
//! [`run_config`] runs the last two, which is what `flowstate run` does for a chain.

pub mod config;
#[cfg(target_os = "linux")]
pub mod live_pipeline;
pub mod pipeline;
pub mod reload;

pub use config::{Config, ConfigError, ConfigErrors};

use config::{Input, LivePort, Output};
use flowstate_chain::{synthetic_share, Counting, Progress, RunError, Runtime, Summary};
use flowstate_io::pcap::{PcapReader, PcapWriter, WriterOptions, LINKTYPE_ETHERNET};
use flowstate_io::synth::{SynthConfig, Synthetic};
use flowstate_io::Sink;
use flowstate_nf::NfFactory;
use flowstate_state::Connector;

/// What a configuration runs (see the crate documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan<'a> {
    /// A cluster (`[cluster]`): its roles run as processes of their own.
    Cluster,
    /// HyperSFC's table pipeline (`[fastpath]`) between two live ports.
    LivePipeline {
        /// The inside port.
        inside: &'a LivePort,
        /// The outside port.
        outside: &'a LivePort,
    },
    /// HyperSFC's table pipeline over a capture or synthetic traffic.
    Pipeline,
    /// The chain as a live two-port box.
    LiveBox {
        /// The inside port.
        inside: &'a LivePort,
        /// The outside port.
        outside: &'a LivePort,
    },
    /// The chain over a capture or synthetic traffic.
    Offline,
}

impl Config {
    /// What this file runs.
    pub fn plan(&self) -> Plan<'_> {
        let live = match (&self.input, &self.output) {
            (Input::Interface(inside), Output::Interface(outside)) => Some((inside, outside)),
            _ => None,
        };
        match (self.cluster.is_some(), self.fastpath.is_some(), live) {
            (true, _, _) => Plan::Cluster,
            (false, true, Some((inside, outside))) => Plan::LivePipeline { inside, outside },
            (false, true, None) => Plan::Pipeline,
            (false, false, Some((inside, outside))) => Plan::LiveBox { inside, outside },
            (false, false, None) => Plan::Offline,
        }
    }
}

/// Why [`run_config`] failed. Each message is complete on its own (no `source()` chain to
/// print after it).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is wrong.
    #[error("{0}")]
    Config(ConfigErrors),
    /// An input or output file cannot be opened or finished.
    #[error("{0}")]
    Io(flowstate_io::Error),
    /// The run failed.
    #[error("{0}")]
    Run(RunError),
    /// A `[fastpath]` pipeline's slow path failed.
    #[error("{0}")]
    Fastpath(flowstate_fastpath::full::SlowError),
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e.into())
    }
}

impl From<ConfigErrors> for Error {
    fn from(e: ConfigErrors) -> Self {
        Error::Config(e)
    }
}

impl From<flowstate_io::Error> for Error {
    fn from(e: flowstate_io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<RunError> for Error {
    fn from(e: RunError) -> Self {
        Error::Run(e)
    }
}

/// Runs a configuration on the store `connector` (which the binary builds from `[state]`):
/// builds the chain from the NF registry, opens the input and the output, runs, and finishes
/// the output file. `progress`, if given, hears about every batch read.
pub fn run_config(
    config: &Config,
    connector: std::sync::Arc<dyn Connector>,
    progress: Option<Progress<'_>>,
) -> Result<Summary, Error> {
    run_config_observed(config, connector, progress, None, None)
}

/// [`run_config`], publishing the run's counters to `observer` as it goes
/// (`flowstate_chain::observe`): what `flowstate run --metrics` exports; and taking the NF
/// configurations `reload` publishes ([`reload`]).
pub fn run_config_observed(
    config: &Config,
    connector: std::sync::Arc<dyn Connector>,
    progress: Option<Progress<'_>>,
    observer: Option<std::sync::Arc<flowstate_chain::observe::Observer>>,
    reload: Option<std::sync::Arc<flowstate_chain::reload::Reload>>,
) -> Result<Summary, Error> {
    let factories: Vec<std::sync::Arc<dyn NfFactory>> = config.factories()?;
    let mut runtime = Runtime::new(config.runtime_options(), factories, connector);
    if let Some(o) = observer {
        runtime = runtime.with_observer(o);
    }
    if let Some(r) = reload {
        runtime = runtime.with_reload(r);
    }

    #[cfg(target_os = "linux")]
    if let Plan::LiveBox { inside, outside } = config.plan() {
        if let Err(e) = flowstate_router::Stop::on_signals() {
            tracing::warn!("cannot catch SIGINT/SIGTERM: {e}");
        }
        let stop = flowstate_router::Stop::new();
        return Ok(flowstate_chain::live::run(
            &runtime, inside, outside, stop, progress,
        )?);
    }

    // Open the input first: a missing input must not truncate an output file.
    enum Opened {
        Reader(PcapReader),
        Generator(Box<Synthetic>),
        PerWorker(SynthConfig),
    }
    let opened = match &config.input {
        Input::Pcap(path) => Opened::Reader(open_pcap(config, path)?),
        Input::Synthetic(s) if s.per_worker => Opened::PerWorker(s.config.clone()),
        Input::Synthetic(s) => Opened::Generator(Box::new(Synthetic::new(s.config.clone())?)),
        Input::Interface(_) => return Err(live_mismatch(config, "input")),
    };
    let mut writer = match &config.output {
        Output::Pcap(path) => Some(PcapWriter::create_with(path, WriterOptions::nanos())?),
        Output::Discard => None,
        Output::Interface(_) => return Err(live_mismatch(config, "output")),
    };
    let sink = writer.as_mut().map(|w| w as &mut (dyn Sink + Send));
    let summary = match opened {
        Opened::Reader(r) => runtime.run(&mut Counting::new(Some(r), progress), sink)?,
        Opened::Generator(g) => runtime.run(&mut Counting::new(Some(*g), progress), sink)?,
        Opened::PerWorker(c) => runtime.run_generated(
            |w| {
                let source = match synthetic_share(&c, w) {
                    Some(share) => Some(Synthetic::new(share)?),
                    None => None,
                };
                Ok(Counting::new(source, progress))
            },
            sink,
        )?,
    };
    if let Some(w) = writer {
        w.finish()?;
    }
    Ok(summary)
}

/// The input capture, which must be Ethernet.
fn open_pcap(config: &Config, path: &std::path::Path) -> Result<PcapReader, Error> {
    let reader = PcapReader::open(path)?;
    if reader.linktype() != LINKTYPE_ETHERNET {
        return Err(ConfigError {
            file: config.file.clone(),
            line: None,
            key: "input.pcap".into(),
            reason: format!(
                "{}: link type {} is not Ethernet (1); only Ethernet captures are supported",
                path.display(),
                reader.linktype()
            ),
        }
        .into());
    }
    Ok(reader)
}

/// A live port on one side only (the configuration check prevents it), or not on Linux.
pub(crate) fn live_mismatch(config: &Config, section: &str) -> Error {
    ConfigError {
        file: config.file.clone(),
        line: None,
        key: format!("{section}.interface"),
        reason: "a live box needs `interface` in both [input] and [output], on Linux".into(),
    }
    .into()
}
