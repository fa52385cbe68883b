//! `flowstate report RESULTS_DIR`: the benches' JSON files as one HTML page with plots
//! (`flowstate_bench::html`).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `flowstate report`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  mkdir -p results\n  flowstate bench hashing --json results/hashing.json\n  \
flowstate report results -o report.html\n\nscripts/bench-all DIR runs every bench into DIR and builds DIR/report.html."
)]
pub(crate) struct ReportArgs {
    /// The directory holding the bench JSON files (`flowstate bench NAME --json DIR/FILE.json`);
    /// several files of one bench are repeated runs, shown as median and spread.
    dir: PathBuf,
    /// Where to write the page (default: RESULTS_DIR/report.html).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Fail on a malformed JSON file instead of skipping it with a warning.
    #[arg(long)]
    strict: bool,
}

pub(crate) fn run(a: &ReportArgs) -> Result<()> {
    let loaded = flowstate_bench::html::load_dir(&a.dir)?;
    for (file, reason) in &loaded.skipped {
        if a.strict {
            bail!("{}: {reason}", file.display());
        }
        eprintln!("flowstate: warning: skipped {}: {reason}", file.display());
    }
    let page = flowstate_bench::html::render(&loaded)?;
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| a.dir.join("report.html"));
    std::fs::write(&out, page).with_context(|| format!("writing {}", out.display()))?;
    let mut names: Vec<&str> = loaded.runs.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    eprintln!(
        "flowstate report: wrote {} ({} bench{} from {} files{})",
        out.display(),
        names.len(),
        if names.len() == 1 { "" } else { "es" },
        loaded.runs.len(),
        if loaded.skipped.is_empty() {
            String::new()
        } else {
            format!(", {} skipped", loaded.skipped.len())
        }
    );
    Ok(())
}
