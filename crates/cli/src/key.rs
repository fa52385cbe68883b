//! `flowstate cluster key new|add|use|remove FILE`: the key file every role of a cluster signs
//! and checks its datagrams with ([`flowstate_cluster::auth`]). Files are written whole through
//! a temporary file and a rename, mode 0600; comments are kept.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use flowstate_cluster::auth::{generate_line, Keys, MAX_KEYS};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What to do with a key file.
#[derive(Debug, Subcommand)]
pub(crate) enum KeyAction {
    /// Create a key file with one new random key (id 1).
    #[command(
        after_help = "Examples:\n  flowstate cluster key new /etc/flowstate/cluster.key\n  \
                            then copy it to every host of the cluster (mode 0600)"
    )]
    New {
        /// The file (refused if it exists).
        file: PathBuf,
    },
    /// Add a new random key that every role accepts but none signs with yet (a rotation's
    /// first step: do it on every host).
    #[command(after_help = "Examples:\n  \
        flowstate cluster key add FILE          (1. then copy FILE to every host)\n  \
        flowstate cluster key use FILE NEW_ID   (2. copy to every host: they sign with the new key)\n  \
        flowstate cluster key remove FILE OLD_ID (3. copy to every host)\n\
        A rotation without a refused datagram; running roles read the file again within a \
        second of a change.")]
    Add {
        /// The file.
        file: PathBuf,
    },
    /// Sign with key ID from now on (it moves to the top of the file).
    #[command(after_help = "Examples:\n  flowstate cluster key use /etc/flowstate/cluster.key 2")]
    Use {
        /// The file.
        file: PathBuf,
        /// The key's id.
        id: u8,
    },
    /// Remove key ID (not the one that signs).
    #[command(
        after_help = "Examples:\n  flowstate cluster key remove /etc/flowstate/cluster.key 1"
    )]
    Remove {
        /// The file.
        file: PathBuf,
        /// The key's id.
        id: u8,
    },
}

pub(crate) fn run(a: &KeyAction) -> Result<()> {
    match a {
        KeyAction::New { file } => {
            let text = format!(
                "# flowstate cluster keys: `ID KEY` per line, the first signs, all are accepted\n{}\n",
                generate_line(1)?
            );
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
                .with_context(|| format!("creating {}", file.display()))?;
            f.write_all(text.as_bytes())?;
            println!("{}: key 1 created (mode 0600)", file.display());
        }
        KeyAction::Add { file } => {
            let (keys, lines) = read(file)?;
            let ids = keys.ids();
            if ids.len() >= MAX_KEYS {
                bail!(
                    "{}: holds {MAX_KEYS} keys already: remove one first",
                    file.display()
                );
            }
            let id = (1..=u8::MAX).find(|i| !ids.contains(i)).unwrap_or(0);
            let mut lines = lines;
            lines.push(generate_line(id)?);
            write(file, &lines)?;
            println!(
                "{}: key {id} added (accepted; key {} still signs)",
                file.display(),
                ids[0]
            );
        }
        KeyAction::Use { file, id } => {
            let (_, mut lines) = read(file)?;
            let at = find(file, &lines, *id)?;
            let line = lines.remove(at);
            let first = lines
                .iter()
                .position(|l| key_id(l).is_some())
                .unwrap_or(lines.len());
            lines.insert(first, line);
            write(file, &lines)?;
            println!("{}: key {id} signs", file.display());
        }
        KeyAction::Remove { file, id } => {
            let (keys, mut lines) = read(file)?;
            if keys.ids()[0] == *id {
                bail!(
                    "{}: key {id} signs: `flowstate cluster key use` another one first",
                    file.display()
                );
            }
            let at = find(file, &lines, *id)?;
            lines.remove(at);
            write(file, &lines)?;
            println!("{}: key {id} removed", file.display());
        }
    }
    Ok(())
}

/// The keys of `file` and its lines.
fn read(file: &Path) -> Result<(Keys, Vec<String>)> {
    let keys = Keys::read(file)?;
    let text = flowstate_config::read_text(file)?;
    Ok((keys, text.lines().map(str::to_string).collect()))
}

/// The id of a key line (not of a comment or a blank line).
fn key_id(line: &str) -> Option<u8> {
    line.split('#')
        .next()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn find(file: &Path, lines: &[String], id: u8) -> Result<usize> {
    lines
        .iter()
        .position(|l| key_id(l) == Some(id))
        .with_context(|| format!("{}: no key {id}", file.display()))
}

/// Replaces `file` with `lines`, mode 0600, checked to read back as keys.
fn write(file: &Path, lines: &[String]) -> Result<()> {
    let text = lines.join("\n") + "\n";
    Keys::parse(&text).map_err(|(line, reason)| anyhow::anyhow!("line {line}: {reason}"))?;
    write_private(file, &text)
}

/// Replaces `file` with `text`, mode 0600 from its creation on (a key, a token, a password),
/// through a temporary file and a rename: a reader never sees half of it.
pub(crate) fn write_private(file: &Path, text: &str) -> Result<()> {
    let tmp = file.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, file).with_context(|| format!("replacing {}", file.display()))?;
    Ok(())
}
