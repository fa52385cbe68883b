//! `flowstate lab up|down|status`: the network-namespace lab of [`flowstate_lab`].

use anyhow::Result;
use clap::{Args, ValueEnum};
use flowstate_lab::{Lab, System};

/// Options of `flowstate lab`.
#[derive(Debug, Args)]
pub(crate) struct LabArgs {
    /// What to do.
    action: Action,
    /// Prefix of every name the lab makes (namespaces `{prefix}client`, `{prefix}nf`,
    /// `{prefix}server`).
    #[arg(long, default_value = "fs-")]
    prefix: String,
    /// `up` only: switch on Linux's own NAT in the box (nftables masquerade) instead of
    /// leaving the box to flowstate; `down` of the lab removes it too.
    #[arg(long)]
    kernel_nat: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Action {
    /// Make the lab (idempotent) and print its addresses.
    Up,
    /// Remove everything the lab made.
    Down,
    /// Show what exists.
    Status,
}

pub(crate) fn run(a: &LabArgs) -> Result<()> {
    let lab = Lab::new(&a.prefix)?;
    let mut exec = System::default();
    match a.action {
        Action::Up => {
            let made = lab.up(&mut exec)?;
            lab.kernel_nat(&mut exec, a.kernel_nat)?;
            println!(
                "lab {}: {}",
                lab.prefix(),
                if made { "up" } else { "already up" }
            );
            print!("{}", lab.describe());
        }
        Action::Down => {
            lab.down(&mut exec)?;
            println!("lab {}: down", lab.prefix());
        }
        Action::Status => {
            let s = lab.status(&mut exec)?;
            let state = match (s.complete, s.namespaces.is_empty() && s.servers.is_empty()) {
                (true, _) => "up",
                (false, true) => "down",
                (false, false) => "partial (run `flowstate lab up` or `down`)",
            };
            println!("lab {}: {state}", lab.prefix());
            println!("namespaces  {}", s.namespaces.join(", "));
            let servers: Vec<String> = s
                .servers
                .iter()
                .map(|(n, p)| format!("{n} (pid {p})"))
                .collect();
            println!("servers     {}", servers.join(", "));
            if s.complete {
                print!("{}", lab.describe());
            }
        }
    }
    Ok(())
}
