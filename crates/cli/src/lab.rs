//! `flowstate lab up|down|status`: the network-namespace lab of [`flowstate_lab`].

use anyhow::Result;
use clap::{Args, ValueEnum};
use flowstate_lab::{instance_addr, Lab, System, MAX_INSTANCES, STORE_ADDR};

/// Options of `flowstate lab`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  flowstate lab up --instances 4   (4 instance namespaces, for flowstate cluster)\n  \
                        flowstate lab up --instances 4 --routed   (each role's host on its own link to a router)\n  \
                        flowstate lab status\n  flowstate lab down"
)]
pub(crate) struct LabArgs {
    /// What to do.
    action: Action,
    /// Prefix of every name the lab makes (namespaces `{prefix}client`, `{prefix}nf`,
    /// `{prefix}server`, `{prefix}i1`.., `{prefix}r1`, `{prefix}r2`, `{prefix}rt`, `{prefix}st`).
    #[arg(long, default_value = "fs-")]
    prefix: String,
    /// `up` only: switch on Linux's own NAT in the box (nftables masquerade) instead of
    /// leaving the box to flowstate; `down` of the lab removes it too.
    #[arg(long)]
    kernel_nat: bool,
    /// `up` only: instance namespaces `{prefix}i1..iN` on the cluster network 192.0.2.0/24 in
    /// the nf namespace (root at 192.0.2.1, instance k at 192.0.2.(10+k)); 0 to 16. A lab that
    /// is up with another count gets instances added or removed; `down` removes them all.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_INSTANCES)))]
    instances: u32,
    /// `up` only, with `--instances`: a routed cluster network instead of one bridge: a router
    /// namespace `{prefix}rt` with a link of its own (10.200.K.0/30, MTU 9000) to the nf
    /// namespace (root 192.0.2.1), a store namespace `{prefix}st` (192.0.2.5, where a managed
    /// store runs) and each instance (192.0.2.(10+k)), each address a /32 routed by the router.
    /// `up` without it makes the bridge again; `down` removes it.
    #[arg(long)]
    routed: bool,
    /// `up` only: Linux's own HA NAT instead of a box: routers `{prefix}r1` (primary) and
    /// `{prefix}r2` (backup) with nftables SNAT, keepalived (VRRP) and conntrackd (FTFW); the nf
    /// namespace becomes a switch. `up` without it switches it off; `down` removes it.
    #[arg(long, conflicts_with = "kernel_nat")]
    kernel_ha: bool,
    /// `up` only: Linux routes in the box (its ports get their addresses, IPv4 forwarding is
    /// on), for a `[fastpath]` table pipeline, which runs in XDP in front of the kernel's
    /// routing (`examples/live-hypersfc.toml`). `up` without it switches it off.
    #[arg(long, conflicts_with_all = ["kernel_nat", "kernel_ha"])]
    kernel_router: bool,
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
    let lab = Lab::new(&a.prefix)?
        .with_instances(a.instances)?
        .with_routed(a.routed);
    let mut exec = System::default();
    match a.action {
        Action::Up => {
            let made = lab.up(&mut exec)?;
            if a.kernel_ha {
                lab.kernel_ha(&mut exec, true)?;
            } else {
                lab.kernel_ha(&mut exec, false)?;
                if a.kernel_router {
                    lab.kernel_router(&mut exec, true)?;
                } else {
                    lab.kernel_nat(&mut exec, a.kernel_nat)?;
                }
            }
            println!(
                "lab {}: {}",
                lab.prefix(),
                if made { "up" } else { "already up" }
            );
            print!("{}", lab.describe());
            if a.kernel_ha {
                print!("{}", lab.describe_kernel_ha());
                if let Some(m) = lab.ha_master(&mut exec)? {
                    println!("            master now: {m}");
                }
            }
        }
        Action::Down => {
            let stopped = lab.down(&mut exec)?;
            if !stopped.is_empty() {
                let pids: Vec<String> = stopped.iter().map(u32::to_string).collect();
                println!(
                    "lab {}: stopped what ran in its namespaces (pids {})",
                    lab.prefix(),
                    pids.join(" ")
                );
            }
            println!("lab {}: down", lab.prefix());
        }
        Action::Status => {
            // Describe the instances that are there, whatever count they were made with.
            let s = lab.status(&mut exec)?;
            let n = u32::try_from(s.instances.len())
                .unwrap_or(MAX_INSTANCES)
                .min(MAX_INSTANCES);
            let lab = lab.with_instances(n)?.with_routed(s.routed && n > 0);
            let s = lab.status(&mut exec)?;
            let state = match (s.complete, s.namespaces.is_empty() && s.servers.is_empty()) {
                (true, _) if s.routed => "up (routed)",
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
            if !s.instances.is_empty() {
                let list: Vec<String> = s
                    .instances
                    .iter()
                    .map(|ns| {
                        let k = ns
                            .strip_prefix(lab.prefix())
                            .and_then(|x| x.strip_prefix('i'))
                            .and_then(|d| d.parse::<u32>().ok())
                            .filter(|k| (1..=MAX_INSTANCES).contains(k));
                        match k {
                            Some(k) => format!("{ns} {}", instance_addr(k)),
                            None => ns.clone(),
                        }
                    })
                    .collect();
                println!("instances   {}", list.join(", "));
            }
            if s.routed {
                println!(
                    "routed      router {}, store {} at {STORE_ADDR}: every role's host on its own link",
                    lab.cluster_router_ns(),
                    lab.store_ns()
                );
            }
            if !s.routers.is_empty() {
                let master = lab.ha_master(&mut exec)?;
                println!(
                    "kernel ha   routers {}; master {}",
                    s.routers.join(", "),
                    master.as_deref().unwrap_or("none")
                );
            }
            if s.complete {
                print!("{}", lab.describe());
                if !s.routers.is_empty() {
                    print!("{}", lab.describe_kernel_ha());
                }
            }
        }
    }
    Ok(())
}
