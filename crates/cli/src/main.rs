//! `flowstate`: the one binary. See `flowstate --help`.

mod backends;
mod check;
#[cfg(test)]
mod check_fuzz;
mod cluster;
mod eve;
mod gen;
mod inspect;
mod key;
mod lab;
mod reload;
mod report;
mod roles;
mod run;
mod state;
mod store;
mod telemetry;
mod top;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Stateful network functions whose state is managed for them.
#[derive(Debug, Parser)]
#[command(
    name = "flowstate",
    version,
    about,
    long_about = None,
    after_help = "Examples:\n  flowstate demo\n  flowstate run examples/nat.toml\n  \
                  flowstate check examples/*.toml\n\n\
                  Each command's --help has examples of its own: flowstate run --help."
)]
struct Cli {
    /// More log lines on stderr: -v info, -vv debug, -vvv trace (warnings and errors by
    /// default). `RUST_LOG`, when set, decides instead (e.g. `RUST_LOG=flowstate_chain=debug`).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// How log lines look: `text`, or `json` (one object per line, for log collectors).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The main job in one command: firewall -> NAT -> load balancer on generated traffic,
    /// state on the embedded store, all cores.
    Demo(DemoArgs),
    /// Run a chain of NFs as a configuration file describes.
    Run(run::RunArgs),
    /// Every error of configuration files, at once, without starting anything (exit status 1
    /// when there is one); else what each file would run.
    Check(check::CheckArgs),
    /// Generate deterministic synthetic traffic as a pcap file.
    Gen(gen::GenArgs),
    /// Show what a capture (pcap or pcapng) holds: protocols, flows, malformed packets.
    Inspect(InspectArgs),
    /// Run an experiment and report its numbers (`--list` shows them all).
    Bench(BenchArgs),
    /// One HTML page with plots from a directory of bench JSON files, beside the papers'
    /// numbers.
    Report(report::ReportArgs),
    /// A network-namespace lab with a client, the box and servers: up, down, status.
    Lab(lab::LabArgs),
    /// Run the state store server (the `store` backend), or ask a running one for its
    /// statistics (`store stats`).
    Store(store::StoreArgs),
    /// Many instances on a shared store, a root that steers, a controller: failover and
    /// scale out/in without a broken connection (in the lab's namespaces).
    Cluster(cluster::ClusterArgs),
    /// A cluster's root, on the host that has the box's ports: steers each packet to the
    /// instance owning its partition and sends their output on.
    Root(roles::RootArgs),
    /// A cluster's NF instance, on any host: joins by reporting to the controller, serves the
    /// partitions it is given.
    Instance(roles::InstanceArgs),
    /// A cluster's controller: admits instances, gives each partition one owner, fails over,
    /// drains.
    Controller(roles::ControllerArgs),
    /// Look at NF state: `state list` prints the NAT's sessions, the firewall's connections,
    /// the LB's flows, from a running box or a store.
    State(state::StateArgs),
    /// A live view of a running box or store in the terminal: packet rates per NF, drops by
    /// reason, table fill, state flushes and errors, read from its `--metrics` listener.
    Top(top::TopArgs),
    /// Make a running box read its configuration file again (as `kill -HUP` does): the
    /// firewall's rules, the LB's backends and the IPS's rules change in place, no connection
    /// lost.
    Reload(reload::ReloadArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  flowstate demo\n  \
                        flowstate demo --flows 100000 --packets 5000000 --workers 2\n  \
                        flowstate demo --json > demo.json")]
struct DemoArgs {
    /// Number of flows.
    #[arg(long, default_value_t = 20_000)]
    flows: u64,
    /// Packets of the synthetic trace, both directions (its outside-to-inside half is
    /// skipped: the reflect stage answers the clients' packets instead).
    #[arg(long, default_value_t = 1_000_000)]
    packets: u64,
    /// Workers (default: all cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
                        flowstate gen --profile mixed --packets 100000 -o trace.pcap\n  \
                        flowstate inspect trace.pcap\n  \
                        flowstate inspect trace.pcap --json --top 5")]
struct InspectArgs {
    /// The capture file.
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// How many of the largest flows to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  flowstate bench --list\n  flowstate bench hashing --quick\n  \
                  flowstate bench nf-throughput --json nf-throughput.json"
)]
struct BenchArgs {
    /// Benchmark name (see --list).
    #[arg(required_unless_present = "list")]
    name: Option<String>,
    /// List the benchmarks.
    #[arg(long)]
    list: bool,
    /// Write the JSON result to this file (it is printed to stdout too).
    #[arg(long)]
    json: Option<PathBuf>,
    /// A short run that only exercises the code (noisy numbers).
    #[arg(long)]
    quick: bool,
    /// How long a bench that runs for a time runs (`soak`), e.g. "10m".
    #[arg(long, value_name = "DURATION")]
    duration: Option<String>,
}

fn main() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let cli = Cli::parse();
    // Commands that print and exit end quietly when their reader goes away (`... | head`), as
    // Unix tools do, instead of panicking on the failed write: SIGPIPE's default action. The
    // long-running roles (store, cluster, lab) keep Rust's default of ignoring it.
    let prints = match &cli.command {
        Command::Demo(_)
        | Command::Gen(_)
        | Command::Inspect(_)
        | Command::Run(_)
        | Command::State(_)
        | Command::Check(_) => true,
        Command::Bench(b) => b.list,
        Command::Top(t) => t.once,
        _ => false,
    };
    if prints {
        // SAFETY: setting a signal's disposition to its default before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // Log lines on stderr as RUST_LOG says, else as -v/-q say (warnings by default); alerts
    // to the EVE file.
    let eve = match &cli.command {
        Command::Run(a) => match a.eve.as_deref().map(eve::EveFile::open) {
            Some(Ok(f)) => Some(f),
            Some(Err(e)) => {
                let path = a.eve.as_deref().unwrap_or(std::path::Path::new(""));
                eprintln!("flowstate: error: --eve {}: {e}", path.display());
                std::process::exit(1);
            }
            None => None,
        },
        _ => None,
    };
    let eve_handle = eve.clone();
    // With an EVE file the alerts go there only, not to stderr too.
    let to_file = eve.is_some();
    let eve = eve.map(|f| {
        f.with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target() == flowstate_nf::ALERT_TARGET
        }))
    });
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let not_eve = tracing_subscriber::filter::filter_fn(move |m| {
        !(to_file && m.target() == flowstate_nf::ALERT_TARGET)
    });
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let stderr = match cli.log_format {
        LogFormat::Text => stderr.boxed(),
        LogFormat::Json => stderr.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(stderr.with_filter(filter).with_filter(not_eve))
        .with(eve)
        .init();
    let result = match cli.command {
        Command::Demo(a) => demo(a),
        Command::Run(a) => run::run(&a),
        Command::Check(a) => match check::run(&a) {
            Ok(true) => Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => Err(e),
        },
        Command::Gen(a) => gen::run(&a).map(|_| ()),
        Command::Inspect(a) => inspect_cmd(&a),
        Command::Bench(a) => bench(&a),
        Command::Report(a) => report::run(&a),
        Command::Lab(a) => lab::run(&a),
        Command::Store(a) => store::run(&a),
        Command::Cluster(a) => cluster::run(&a),
        Command::Root(a) => roles::root_command(&a),
        Command::Instance(a) => roles::instance_command(&a),
        Command::Controller(a) => roles::controller_command(&a),
        Command::State(a) => state::run(&a),
        Command::Top(a) => top::run(&a),
        Command::Reload(a) => reload::run(&a),
    };
    if let Some(e) = &eve_handle {
        e.flush();
    }
    if let Err(e) = result {
        eprintln!("flowstate: error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, `: `-separated, leaving out a cause whose text the message
/// before it already ends with (our errors often spell their source out themselves).
fn error_chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if text.ends_with(&s) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s);
    }
    text
}

/// A progress bar on a terminal (a counter when `len` is 0, unknown), hidden when stderr is
/// piped.
pub(crate) fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = if len > 0 {
        (
            indicatif::ProgressBar::new(len),
            "{msg} [{bar:40}] {human_pos}/{human_len} {per_sec} eta {eta}",
        )
    } else {
        (
            indicatif::ProgressBar::new_spinner(),
            "{msg} {spinner} {human_pos} {per_sec}",
        )
    };
    let style = indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
}

/// The chain `flowstate demo` runs: the example a user can copy and edit.
const DEMO_CONFIG: &str = include_str!("../../../examples/chain.toml");

fn demo(a: DemoArgs) -> Result<()> {
    let mut config =
        flowstate_deploy::Config::parse(DEMO_CONFIG, Path::new("examples/chain.toml"))?;
    config.runtime.workers = a
        .workers
        .unwrap_or_else(flowstate_deploy::config::default_workers);
    if let flowstate_deploy::config::Input::Synthetic(s) = &mut config.input {
        s.config.flows = a.flows;
        s.config.packets = a.packets;
        s.config.validate()?;
        // Each worker generates its own share, as a NIC's receive queues fill in parallel:
        // one generator thread would be the limit (issue #22).
        s.per_worker = true;
    }
    if !a.json {
        eprintln!(
            "flowstate demo: the clients' packets of a synthetic trace of {} packets in {} flows \
             through firewall -> NAT -> load balancer, {} workers each generating its share, state \
             on the embedded store, established flows' packets past the NFs by each worker's flow \
             cache.\nThe reflect stage answers each packet that leaves the chain \
             as its outside host would, back through the chain (the trace's own server packets \
             are not generated: they are addressed to the clients' inside addresses, which a NAT \
             never receives).",
            a.packets, a.flows, config.runtime.workers
        );
    }
    let bar = progress(a.packets, "demo");
    let connector = backends::connector(&config)?;
    let summary = flowstate_deploy::run_config(&config, connector, Some(&|n| bar.inc(n)))?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{summary}");
        if let Some(lb) = summary.nfs.iter().find(|n| n.name == "lb") {
            println!(
                "(lb: its {} flows are the connections addressed to one of its VIPs; the rest of \
                 the traffic passes it untouched. \"now\" entries are levels at the end, \"total\" \
                 entries counts since the start.)",
                lb.report.get("flows").copied().unwrap_or(0)
            );
        }
    }
    Ok(())
}

fn inspect_cmd(a: &InspectArgs) -> Result<()> {
    let bar = progress(0, "inspect");
    let summary = inspect::inspect(&a.file, a.top, &bar)?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        summary.print();
    }
    if let Some(e) = &summary.error {
        bail!("{e}");
    }
    Ok(())
}

fn bench(a: &BenchArgs) -> Result<()> {
    if a.list {
        for b in flowstate_bench::BENCHES {
            println!("{:<12} {}", b.name, b.about);
        }
        return Ok(());
    }
    let name = a.name.as_deref().unwrap_or_default();
    let Some(b) = flowstate_bench::find(name) else {
        let names: Vec<_> = flowstate_bench::BENCHES.iter().map(|b| b.name).collect();
        bail!("unknown benchmark {name:?}; known: {}", names.join(", "));
    };
    let effort = if a.quick {
        flowstate_bench::Effort::Quick
    } else {
        flowstate_bench::Effort::Full
    };
    let report = match &a.duration {
        Some(d) if b.name == "soak" => {
            let d = flowstate_config::parse_duration(d)
                .map_err(|e| anyhow::anyhow!("--duration: {e}"))?;
            flowstate_bench::soak::run_for(d)
        }
        Some(_) => bail!("--duration: only the soak bench takes a duration"),
        None => b.run(effort),
    };
    let json = report.to_json();
    if let Some(path) = &a.json {
        write_file(path, &json)?;
    }
    println!("{json}");
    Ok(())
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod error_tests {
    use super::error_chain;

    /// An error that spells its source out, as ours do.
    #[derive(Debug)]
    struct Spelled(std::io::Error);

    impl std::fmt::Display for Spelled {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "/data: {}", self.0)
        }
    }

    impl std::error::Error for Spelled {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_the_message_spells_out_is_said_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = anyhow::Error::new(Spelled(io())).context("store");
        assert_eq!(error_chain(&e), "store: /data: gone");
        let e = anyhow::Error::new(io()).context("reading /x");
        assert_eq!(error_chain(&e), "reading /x: gone");
    }
}
