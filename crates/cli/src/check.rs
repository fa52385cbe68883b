//! `flowstate check CONFIG...`: every error of a deployment file, found the way `run` and
//! `cluster up` load it (the sections, each NF's options by building its factory, the
//! cluster's sections, the store driver's settings, a fast-path pipeline's prefix files),
//! without connecting to a store or touching an interface.

use crate::backends::{self, Backend};
use anyhow::Result;
use clap::Args;
use flowstate_cluster::ClusterSection;
use flowstate_deploy::config::{Input, Output, StateSection};
use flowstate_deploy::{Config, ConfigError, ConfigErrors};
use std::path::{Path, PathBuf};

/// Options of `flowstate check`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  flowstate check examples/nat.toml\n  flowstate check examples/*.toml --json\n\n\
                  Each error is FILE:LINE: KEY: what is wrong, e.g.\n  \
                  box.toml:12: chain[1].nat.udp: write a duration with its unit, e.g. \"300s\"\n\
                  Exit status: 0 when every file is correct, 1 otherwise."
)]
pub(crate) struct CheckArgs {
    /// The configuration files (TOML). Relative paths in them are relative to the current
    /// directory, as for `run`.
    #[arg(required = true, value_name = "CONFIG")]
    configs: Vec<PathBuf>,
    /// Print a JSON array with one object per file (`file`, `ok`, `errors` with `file`,
    /// `line`, `key`, `reason`, and `summary`) instead of text.
    #[arg(long)]
    json: bool,
}

/// A file loaded as `run` and `cluster up` load it, nothing started.
pub(crate) struct Loaded {
    /// The configuration.
    pub(crate) config: Config,
    /// The store, its settings checked.
    pub(crate) backend: Backend,
    /// The file as read.
    pub(crate) text: String,
}

/// Loads `path` as `run` and `cluster up` do: every error of the file, in its order.
pub(crate) fn load(path: &Path) -> Result<Loaded, ConfigErrors> {
    let text = flowstate_config::read_text(path)
        .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
    let at = |key: String, reason: String| ConfigError {
        file: path.to_owned(),
        line: flowstate_config::line_of(&text, &key),
        key,
        reason,
    };
    let (config, mut errors) = match Config::parse(&text, path) {
        Ok(c) => (Some(c), Vec::new()),
        Err(e) => (None, e.0),
    };
    // A syntax error is the one error.
    if toml::from_str::<toml::Table>(&text).is_err() {
        return Err(ConfigErrors(errors));
    }
    let state = match &config {
        Some(c) => Some(c.state.clone()),
        None => StateSection::from_text(&text),
    };
    let backend = state
        .as_ref()
        .and_then(|s| match backends::settings(path, s) {
            Ok(b) => Some(b),
            Err(e) => {
                errors.push(at(e.key, e.reason));
                None
            }
        });
    if let Some(c) = &config {
        if let Some(section) = &c.cluster {
            errors.extend(deployment_errors(c, section, &text));
        }
        if let Some(fp) = &c.fastpath {
            if let Err((key, reason)) = fp.load_rules() {
                errors.push(at(key, reason));
            }
        }
        if let Input::Pcap(p) = &c.input {
            if let Err(e) = std::fs::File::open(p) {
                errors.push(at(
                    "input.pcap".into(),
                    format!("cannot read {}: {e}", p.display()),
                ));
            }
        }
    }
    match (config, backend) {
        (Some(config), Some(backend)) if errors.is_empty() => Ok(Loaded {
            config,
            backend,
            text,
        }),
        _ => {
            errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
            Err(ConfigErrors(errors))
        }
    }
}

/// What a cluster deployment needs beyond a correct `[cluster]`, each error with its line in
/// the file's `text`.
pub(crate) fn deployment_errors(
    config: &Config,
    section: &ClusterSection,
    text: &str,
) -> Vec<ConfigError> {
    // `key` as shown, and where it stands in the file.
    let error = |key: String, at: &str, reason: String| ConfigError {
        file: config.file.clone(),
        line: flowstate_config::line_of(text, at),
        key,
        reason,
    };
    let mut errors = Vec::new();
    if section.stages.len() > config.stages() as usize {
        errors.push(error(
            "cluster.stage".into(),
            "cluster.stage",
            format!(
                "{} [[cluster.stage]] tables for a chain of {} stage(s) (`[[chain]] stage = k`)",
                section.stages.len(),
                config.stages()
            ),
        ));
    }
    if !matches!(config.input, Input::Interface(_)) {
        errors.push(error(
            "input".into(),
            "input",
            "the root needs two ports: `[input] interface = ...` and `[output] interface = ...`"
                .into(),
        ));
    }
    if config.state.backend == flowstate_deploy::config::BackendKind::Local {
        errors.push(error(
            "state.backend".into(),
            "state.backend",
            "the instances share their state: choose store, redis, redis-cluster or cassandra"
                .into(),
        ));
    }
    if let Some(key_file) = section.key_path(&base_dir(&config.file)) {
        if let Err(e) = flowstate_cluster::auth::Keys::read(&key_file) {
            errors.push(error(
                "cluster.key_file".into(),
                "cluster.key_file",
                e.to_string(),
            ));
        }
    }
    // The factories' own errors are the file's already.
    for (i, f) in config.factories().into_iter().flatten().enumerate() {
        if let Some((key, reason)) = f.private_state() {
            // Shown as `chain[i].NF.KEY`, as the NFs' own errors are; `chain[i].KEY` in the file.
            let shown = format!("chain[{i}].{}.{key}", f.name());
            errors.push(error(shown, &format!("chain[{i}].{key}"), reason.into()));
        }
    }
    errors
}

/// The directory of the deployment file `file` (its relative paths are from there).
pub(crate) fn base_dir(file: &std::path::Path) -> std::path::PathBuf {
    std::fs::canonicalize(file)
        .ok()
        .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
        .unwrap_or_default()
}

/// Checks every file; prints each one's errors (stderr) or what it would run (stdout), or
/// JSON on stdout. `Ok(false)` when a file has errors.
pub(crate) fn run(args: &CheckArgs) -> Result<bool> {
    let mut all_ok = true;
    let mut reports = Vec::new();
    for path in &args.configs {
        let result = load(path);
        all_ok &= result.is_ok();
        if args.json {
            reports.push(match &result {
                Ok(l) => serde_json::json!({
                    "file": path,
                    "ok": true,
                    "errors": [],
                    "summary": summary(l)
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), serde_json::Value::from(v)))
                        .collect::<serde_json::Map<_, _>>(),
                }),
                Err(e) => serde_json::json!({
                    "file": path,
                    "ok": false,
                    "errors": e.iter().map(|e| serde_json::json!({
                        "file": e.file,
                        "line": e.line,
                        "key": e.key,
                        "reason": e.reason,
                    })).collect::<Vec<_>>(),
                    "summary": null,
                }),
            });
            continue;
        }
        match result {
            Ok(l) => {
                println!("{}: ok", path.display());
                for (what, v) in summary(&l) {
                    println!("  {what:<9} {v}");
                }
            }
            Err(e) => {
                eprintln!("{e}");
                eprintln!(
                    "{}: {} error{}",
                    path.display(),
                    e.len(),
                    if e.len() == 1 { "" } else { "s" }
                );
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(all_ok)
}

/// What the file would run, one line per part.
pub(crate) fn summary(l: &Loaded) -> Vec<(&'static str, String)> {
    let c = &l.config;
    let input = match &c.input {
        Input::Pcap(p) => format!("pcap {}", p.display()),
        Input::Synthetic(s) => format!(
            "synthetic {:?}, {} flows, {} packets{}",
            s.config.profile,
            s.config.flows,
            s.config.packets,
            if s.per_worker { ", per worker" } else { "" }
        )
        .to_lowercase(),
        Input::Interface(p) => live(p),
    };
    let input = if c.outbound_only {
        format!("{input} (outbound packets only)")
    } else {
        input
    };
    let output = match &c.output {
        Output::Pcap(p) => format!("pcap {}", p.display()),
        Output::Discard => "discard".into(),
        Output::Interface(p) => live(p),
    };
    let chain = match &c.fastpath {
        Some(fp) => format!(
            "[fastpath] pipeline of {} tables ({}), mode {}",
            fp.pipeline.tables.len(),
            fp.pipeline
                .tables
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            fp.mode.name()
        ),
        None if c.chain.is_empty() => "no NF (packets pass)".into(),
        None => c
            .chain
            .iter()
            .map(|e| {
                if c.stages() > 1 {
                    format!("{} (stage {})", e.nf, e.stage)
                } else {
                    e.nf.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" -> "),
    };
    let state = format!(
        "{}, flush every {}",
        l.backend.describe(&c.state),
        flowstate_config::format_duration(c.state.flush_interval)
    );
    let workers = format!(
        "{}{}",
        c.runtime.workers,
        if c.runtime.reflect {
            ", reflect (the outside hosts answer)"
        } else {
            ""
        }
    );
    let mut s = vec![
        ("input", input),
        ("output", output),
        ("chain", chain),
        ("state", state),
        ("workers", workers),
    ];
    if let Some(cl) = &l.config.cluster {
        s.push((
            "cluster",
            format!(
                "{} partitions, {} instances ({} to {}), heartbeat {}, store {}",
                cl.partitions,
                cl.instances,
                cl.min_instances,
                cl.max_instances,
                flowstate_config::format_duration(cl.heartbeat),
                match cl.store {
                    flowstate_cluster::StoreMode::Managed => "managed",
                    flowstate_cluster::StoreMode::External => "external",
                }
            ),
        ));
        s.push((
            "authentication",
            match cl.key_path(&base_dir(&l.config.file)) {
                _ if cl.unauthenticated => "none (cluster.unauthenticated)".into(),
                Some(p) => format!("AES-256-GCM, keys in {}", p.display()),
                None => "AES-256-GCM, the lab's key (`cluster up` makes it)".into(),
            },
        ));
        s.push((
            "fencing",
            match c.state.backend {
                flowstate_deploy::config::BackendKind::Cassandra if cl.unfenced_store => {
                    "none: cassandra cannot fence commits (cluster.unfenced_store)".into()
                }
                flowstate_deploy::config::BackendKind::Cassandra => {
                    "none: cassandra cannot fence commits, and instances refuse to start \
                     without cluster.unfenced_store = true"
                        .into()
                }
                _ => "every commit fenced by the store".to_owned(),
            },
        ));
    }
    if let Some(a) = c.telemetry.listen {
        s.push(("metrics", format!("http://{a}/metrics")));
    }
    s
}

fn live(p: &flowstate_deploy::config::LivePort) -> String {
    format!(
        "interface {} (address {}, {}{})",
        p.interface,
        p.address,
        match p.driver {
            flowstate_deploy::config::Driver::AfPacket => "af-packet",
            flowstate_deploy::config::Driver::AfXdp => "af-xdp",
        },
        if p.fast_path.is_some() {
            ", XDP fast path"
        } else {
            ""
        }
    )
}
