//! `flowstate run` on a `[fastpath]` pipeline with live interfaces: HyperSFC's fast path in
//! XDP on the box's two ports ([`flowstate_fastpath::xdp`]), the slow path in this thread.
//!
//! ```text
//!  inside port --XDP: tables--> all hit: rewritten, on to the kernel (it routes) or the egress
//!  outside port          |                port's interface
//!                        | a miss: circulation header, to the port's XDP socket
//!                        v
//!              slow path (here): full tables searched, entries installed, answers written
//!                        | sent from <recirculation>-tx
//!                        v
//!  <recirculation> --XDP: tables, resumed with the answers--> on to the kernel ...
//! ```
//!
//! The box routes with the kernel: its ports need their addresses and IPv4 forwarding on
//! (`sysctl net.ipv4.ip_forward=1`), as any Linux router; the program takes every frame first,
//! so the tables see every IPv4 TCP/UDP packet before the kernel does, and what they drop the
//! kernel never sees. Everything else (ARP, ICMP, IPv6) goes on to the kernel unchanged.
//!
//! The recirculation port is a veth pair this run makes (`[fastpath] recirculation`, default
//! `fs-rc`, and its peer `fs-rc-tx`) and removes when it ends; a pair of that name left by an
//! earlier run is replaced. Its MTU leaves room for the circulation header. The slow path
//! addresses each answered frame to the pair's receiving end, so that the kernel forwards it
//! after the program's second pass, and turns off reverse-path filtering on that end (the
//! frames' sources are reached by the box's ports, not by it).
//!
//! Limits: one slow-path thread (`lazy-p` searches in turn, as `lazy`); the ports' queue 0
//! (veth and single-queue devices); the XDP programs in generic mode.

use crate::config::{Config, LivePort};
use crate::pipeline::{PipelineSummary, TableSummary};
use crate::Error;
use arc_swap::ArcSwapOption;
use flowstate_fastpath::full::{self, FullTables};
use flowstate_fastpath::xdp::{XdpError, XdpFastPath, CIRC_BYTES, SEARCH_BYTES};
use flowstate_io::afpacket::{interface_info, AfPacket, AfPacketOptions};
use flowstate_io::afxdp::{AfXdp, AfXdpOptions};
use flowstate_io::{PacketBatch, PacketMeta, Port};
use flowstate_router::Stop;
use flowstate_state::Connector;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

/// MTU of the recirculation pair: a 1500-byte packet, its Ethernet header and the largest
/// circulation header, with room to spare.
const RECIRCULATION_MTU: u32 = 4000;
/// Frames taken from a socket at a time.
const BATCH: usize = 64;

/// The veth pair answers are sent through; removed on drop.
struct Recirculation {
    rx: String,
    tx: String,
}

impl Recirculation {
    fn create(name: &str) -> Result<Recirculation, Error> {
        let rc = Recirculation {
            rx: name.to_owned(),
            tx: format!("{name}-tx"),
        };
        // A pair left by a run that did not end cleanly.
        let _ = ip(&["link", "del", &rc.rx]);
        let mtu = RECIRCULATION_MTU.to_string();
        ip(&[
            "link", "add", &rc.rx, "mtu", &mtu, "type", "veth", "peer", "name", &rc.tx, "mtu", &mtu,
        ])?;
        ip(&["link", "set", &rc.rx, "up"])?;
        ip(&["link", "set", &rc.tx, "up"])?;
        let rp_filter = format!("/proc/sys/net/ipv4/conf/{}/rp_filter", rc.rx);
        std::fs::write(&rp_filter, "0").map_err(|e| device(&rc.rx, "turning off rp_filter", e))?;
        if std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter")
            .is_ok_and(|v| v.trim() != "0")
        {
            tracing::warn!(
                "net.ipv4.conf.all.rp_filter is on: the kernel may drop answered packets arriving on {}",
                rc.rx
            );
        }
        Ok(rc)
    }
}

impl Drop for Recirculation {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.rx]);
    }
}

fn device(dev: &str, what: &str, e: std::io::Error) -> Error {
    Error::Io(flowstate_io::Error::Device {
        device: dev.to_owned(),
        what: what.into(),
        source: e,
    })
}

/// Runs `ip ARGS`; its error output in the error.
fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| device("ip", "running iproute2's ip (is it installed?)", e))?;
    if !out.status.success() {
        return Err(device(
            args.get(2).copied().unwrap_or("ip"),
            &format!("ip {}", args.join(" ")),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        ));
    }
    Ok(())
}

fn xdp_err(e: XdpError) -> Error {
    match e {
        XdpError::Io(e) => Error::Io(e),
        XdpError::Slow(e) => Error::Fastpath(e),
        e => Error::Io(flowstate_io::Error::Device {
            device: "xdp table pipeline".into(),
            what: "running".into(),
            source: std::io::Error::other(e.to_string()),
        }),
    }
}

/// Runs `config`'s `[fastpath]` pipeline on the live ports `inside` and `outside` until
/// `stop` (or a signal, once [`Stop::on_signals`] ran).
pub fn run_pipeline_live(
    config: &Config,
    connector: Arc<dyn Connector>,
    inside: &LivePort,
    outside: &LivePort,
    stop: Stop,
    publish: Option<&ArcSwapOption<PipelineSummary>>,
) -> Result<PipelineSummary, Error> {
    let (fp, rules) = crate::pipeline::section(config)?;
    let pipeline = &fp.pipeline;
    let loaded = full::load(&*connector, pipeline, &rules).map_err(Error::Fastpath)?;
    let mut xdp = XdpFastPath::new(pipeline, fp.mode, &loaded.blooms).map_err(|e| match e {
        // What the program cannot do is the configuration's error, named by its key.
        XdpError::Unsupported { table, reason } => {
            let i = pipeline.tables.iter().position(|t| t.name == table);
            crate::ConfigError::new(
                &config.file,
                format!("fastpath.table[{}]", i.unwrap_or(0)),
                format!("{reason} in the XDP fast path of a live box"),
            )
            .into()
        }
        e => xdp_err(e),
    })?;
    let rc = Recirculation::create(&fp.recirculation)?;
    let (_, rx_mac) = interface_info(&rc.rx)?;
    let mut sockets = Vec::new();
    let mut programs = Vec::new();
    for ifname in [&inside.interface, &outside.interface, &rc.rx] {
        let program = xdp.attach(ifname, 1).map_err(xdp_err)?;
        sockets.push(AfXdp::open(
            ifname,
            Arc::clone(&program),
            &AfXdpOptions::default(),
        )?);
        programs.push(program);
    }
    xdp.set_recirculation_port(programs[2].ifindex())
        .map_err(xdp_err)?;
    let mut tx = AfPacket::open(
        &rc.tx,
        &AfPacketOptions {
            receive: false,
            qdisc_bypass: true,
            ..AfPacketOptions::default()
        },
    )?;
    let mut full = FullTables::open(&*connector, pipeline, loaded.prefixes.clone())
        .map_err(Error::Fastpath)?;
    tracing::info!(
        "table pipeline in XDP on {} and {} ({} submit), answers through {}",
        inside.interface,
        outside.interface,
        fp.mode.name(),
        rc.rx
    );

    let mut summary = PipelineSummary {
        mode: fp.mode.name().into(),
        backend: connector.name().into(),
        ..PipelineSummary::default()
    };
    let mut live = crate::pipeline::LiveCounters::default();
    let mut batch = PacketBatch::new(BATCH, 2048);
    let mut out = PacketBatch::new(BATCH, RECIRCULATION_MTU as usize + 14);
    let mut answer = Vec::with_capacity(RECIRCULATION_MTU as usize);
    let mut fds: Vec<libc::pollfd> = sockets
        .iter()
        .filter_map(|s| s.raw_fd())
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let start = Instant::now();
    let mut next_publish = start;
    while !stop.stopped() {
        if let Some(slot) = publish {
            let now = Instant::now();
            if now >= next_publish {
                next_publish = now + flowstate_chain::observe::PUBLISH_EVERY;
                let so_far = finish(
                    summary.clone(),
                    live.clone(),
                    &xdp,
                    start,
                    pipeline,
                    &loaded.rules,
                )?;
                slot.store(Some(Arc::new(so_far)));
            }
        }
        // SAFETY: `fds` is a valid array of pollfd for the call's duration.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(device("xdp table pipeline", "waiting for frames", e));
        }
        for s in &mut sockets {
            loop {
                batch.clear();
                if s.recv_ready(&mut batch, 0, &mut |_| true)? == 0 {
                    break;
                }
                out.clear();
                for (frame, _) in batch.iter() {
                    match xdp.serve(&mut full, frame, &mut answer) {
                        Ok(hdr) => {
                            summary.searches += u64::from(hdr.count);
                            live.first_circulations += u64::from(hdr.circulations == 1);
                            summary.link_bytes += (frame.len() + answer.len()) as u64;
                            // To the recirculation end, so that the kernel takes it in.
                            let eth = CIRC_BYTES + usize::from(hdr.count) * SEARCH_BYTES;
                            if let Some(dst) = answer.get_mut(eth..eth + 6) {
                                dst.copy_from_slice(&rx_mac);
                            }
                            out.push(&answer, PacketMeta::default());
                        }
                        Err(XdpError::Malformed(why)) => {
                            live.malformed += 1;
                            tracing::debug!("a frame from the fast path dropped: {why}");
                        }
                        Err(e) => return Err(xdp_err(e)),
                    }
                }
                live.answered += out.len() as u64;
                tx.send(&mut out.iter().map(|(f, _)| f))?;
            }
        }
    }
    let summary = finish(summary, live, &xdp, start, pipeline, &loaded.rules)?;
    if let Some(slot) = publish {
        slot.store(Some(Arc::new(summary.clone())));
    }
    Ok(summary)
}

/// The summary so far: what the slow path counted (`summary`, `live`) and what the program
/// counts, read from its maps now.
fn finish(
    mut summary: PipelineSummary,
    mut live: crate::pipeline::LiveCounters,
    xdp: &XdpFastPath,
    start: Instant,
    pipeline: &flowstate_fastpath::table::Pipeline,
    rules: &[usize],
) -> Result<PipelineSummary, Error> {
    summary.seconds = start.elapsed().as_secs_f64();
    let c = xdp.counters().map_err(xdp_err)?;
    summary.packets_in = (c.fast.passes + c.unmatched).saturating_sub(live.answered);
    summary.packets_out = c.forwarded + c.unmatched;
    summary.dropped = c.dropped;
    summary.unmatched = c.unmatched;
    summary.circulations = c.fast.submits;
    summary.fast_path_only = c.fast.done.saturating_sub(live.first_circulations);
    summary.fast_stats(&c.fast);
    live.forged = c.forged;
    live.no_room = c.no_room;
    live.no_socket = c.no_socket;
    for (t, table) in pipeline.tables.iter().enumerate() {
        let s = xdp.cache_stats(t).map_err(xdp_err)?;
        summary.tables.push(TableSummary {
            name: table.name.clone(),
            rules: rules.get(t).copied().unwrap_or(0) as u64,
            cached: xdp.cached(t) as u64,
            hits: s.hits,
            misses: s.misses,
            installed: s.installed,
            evicted: s.evicted,
            uncacheable: s.uncacheable,
        });
    }
    summary.live = Some(live);
    Ok(summary)
}
