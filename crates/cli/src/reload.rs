//! `flowstate reload ADDR`: asks a running box to read its configuration file again (what
//! `kill -HUP` does), and prints what changed or why it was refused.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `flowstate reload`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  flowstate reload 127.0.0.1:9464\n  \
                        flowstate reload 9464 --token-file /etc/flowstate/telemetry.token\n  \
                        kill -HUP $(pidof flowstate)   # the same, without a listener")]
pub(crate) struct ReloadArgs {
    /// The box's telemetry address (`--metrics`, `[telemetry] listen`).
    addr: String,
    /// Present the token in FILE to the box's listener (its `[telemetry] token_file`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Print the box's answer as JSON.
    #[arg(long)]
    json: bool,
}

/// Asks the box at `ADDR` to reload; fails (exit status 1) with every reason when it refuses.
pub(crate) fn run(a: &ReloadArgs) -> Result<()> {
    let (addr, token) = crate::telemetry::box_at(&a.addr, a.token_file.as_deref())?;
    // A reload compiles the new rules of every NF: give it time.
    let reply = flowstate_telemetry::client::post_with(
        addr,
        "/api/v1/reload",
        Duration::from_secs(30),
        token.as_ref(),
    )
    .with_context(|| format!("{addr}: cannot ask for a reload"))?;
    let body: serde_json::Value = match reply.status {
        200 | 422 => serde_json::from_slice(&reply.body)
            .with_context(|| format!("{addr}: a malformed answer"))?,
        405 => bail!("{addr}: this process does not reload (only a live box does)"),
        s => bail!("{addr}: answered {s}: {}", reply.text().trim()),
    };
    if a.json {
        println!("{body}");
    }
    if reply.status == 422 {
        let errors: Vec<&str> = body["errors"]
            .as_array()
            .map(|e| e.iter().filter_map(|e| e.as_str()).collect())
            .unwrap_or_default();
        bail!(
            "the box refused the reload and runs on unchanged:\n  {}",
            errors.join("\n  ")
        );
    }
    if !a.json {
        match body["changed"].as_array().filter(|c| !c.is_empty()) {
            Some(c) => {
                let names: Vec<&str> = c.iter().filter_map(|n| n.as_str()).collect();
                println!("reloaded: {}", names.join(", "));
            }
            None => println!("reloaded: nothing changed"),
        }
    }
    Ok(())
}
