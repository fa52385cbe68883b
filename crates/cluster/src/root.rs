//! The root: the cluster's ingress and egress on the two ports (StatelessNF §4.2 steering,
//! CHC §4.2 root).
//!
//! ```text
//!  inside hosts --port 0--> [root: partition -> owner, clock, hold] ==GENEVE==> instance k
//!  outside hosts <--port 1-- [route out by destination]           <==GENEVE== (output)
//! ```
//!
//! * It answers ARP and routes like the live box ([`flowstate_chain::live`]): the ports are
//!   the box's, the chain runs in the instances.
//! * Each IPv4 packet's traffic partition comes from the chain's NFs
//!   ([`flowstate_chain::owners`]) over the symmetric flow hash; it goes to the partition's
//!   owner in a GENEVE frame ([`crate::meta`]) stamped with partition, epoch, direction and a
//!   logical clock (the root numbers packets in arrival order).
//! * Frames coming back are sent out the port their destination says. Per partition, their
//!   clocks must rise: a frame older than one already sent is counted as reordered.
//! * Moves follow [`crate::steer`]; the assignment comes from the controller.
//! * With `[input] fast_path` (the default, when every NF allows it), established flows are
//!   forwarded by an XDP program on the ports, taught by the instances' output
//!   ([`crate::fast`]); what reaches this loop is the rest.

use crate::config::{ClusterSection, CONTROL_PORT};
use crate::fast::{FastStats, RootFastPath};
use crate::meta::{self, Kind, Meta};
use crate::steer::{Control, Route, Steer, SteerConfig, SteerStats};
use crate::udp::Datagrams;
use crate::{udp_socket, wall_ns, ClusterError};
use flowstate_chain::live::{LiveSink, LiveSource, PortAddr, Shared, Stop};
use flowstate_chain::owners::Owners;
use flowstate_chain::steer::Steering;
use flowstate_control::cluster::Assignment;
use flowstate_io::afpacket::{AfPacket, AfPacketOptions};
use flowstate_io::PacketBatch;
use serde::Serialize;
use std::io::ErrorKind;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest frame the root carries.
const MAX_FRAME: usize = 2048;

/// The root's counters, written to its stats file every 200 ms.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RootStats {
    /// IPv4 frames taken from the ports.
    pub received: u64,
    /// Frames sent to instances (held ones included once sent).
    pub to_instances: u64,
    /// Frames that came back and were sent out.
    pub from_instances: u64,
    /// Frames that do not parse.
    pub malformed: u64,
    /// Frames back from instances older than one already sent for their partition.
    pub reordered: u64,
    /// Frames from instances that are not ours.
    pub bad_frames: u64,
    /// The moves.
    #[serde(flatten)]
    pub steer: SteerStats,
    /// Partitions moving now.
    pub moving: u64,
    /// The newest assignment applied.
    pub assignment_version: u64,
    /// Median duration of the finished moves, ms.
    pub move_ms_p50: f64,
    /// Send errors towards instances.
    pub send_errors: u64,
    /// The XDP fast path (zero when it is off).
    #[serde(flatten)]
    pub fast: FastStats,
}

/// What the root needs to run.
#[derive(Debug, Clone)]
pub struct RootOptions {
    /// The cluster.
    pub section: ClusterSection,
    /// Inside port.
    pub inside: flowstate_chain::config::LivePort,
    /// Outside port.
    pub outside: flowstate_chain::config::LivePort,
    /// Sources that make a packet Outbound.
    pub inside_prefixes: Vec<flowstate_chain::steer::IpPrefix>,
    /// Where to write the stats (JSON, replaced atomically).
    pub stats_file: Option<PathBuf>,
}

/// Runs the root until `stop`.
pub fn run_root(
    o: &RootOptions,
    chain: &[Arc<dyn flowstate_nf::NfFactory>],
    stop: Stop,
) -> Result<RootStats, ClusterError> {
    let s = &o.section;
    let tx = AfPacketOptions {
        receive: false,
        qdisc_bypass: true,
        ..AfPacketOptions::default()
    };
    let io = |e: flowstate_io::Error| ClusterError::Io(std::io::Error::other(e.to_string()));
    let rx_ports = [
        AfPacket::open(&o.inside.interface, &AfPacketOptions::default()).map_err(io)?,
        AfPacket::open(&o.outside.interface, &AfPacketOptions::default()).map_err(io)?,
    ];
    let tx_ports = [
        AfPacket::open(&o.inside.interface, &tx).map_err(io)?,
        AfPacket::open(&o.outside.interface, &tx).map_err(io)?,
    ];
    let addrs = [
        PortAddr {
            address: o.inside.address,
            gateway: o.inside.gateway,
        },
        PortAddr {
            address: o.outside.address,
            gateway: o.outside.gateway,
        },
    ];
    let shared = Arc::new(Shared::default());
    let mut source = LiveSource::new(rx_ports, addrs, Arc::clone(&shared), stop.clone());
    // The fast path, when the chain allows it (every NF does) and the kernel takes it.
    let allowed = chain.iter().all(|f| f.fast_path());
    let why_not = (!allowed).then_some("an NF of the chain must see every packet");
    let mut fast = flowstate_chain::live::attach_fast_path(&o.inside, &o.outside, why_not)
        .map_err(|e| ClusterError::Config(e.to_string()))?
        .map(|loaded| {
            let capacity = o.inside.fast_path.map_or(0, |c| c.capacity);
            RootFastPath::new(loaded, s.partitions, capacity, MAX_FRAME)
        });
    let mut sink = LiveSink::new(
        tx_ports,
        addrs,
        o.inside_prefixes.clone(),
        shared,
        64,
        MAX_FRAME,
    );
    let data = udp_socket(SocketAddrV4::new(s.address, meta::PORT))?;
    let control = udp_socket(SocketAddrV4::new(s.address, CONTROL_PORT))?;
    let steering = Steering::new(o.inside_prefixes.clone(), s.partitions as usize)
        .with_owners(Owners::new(chain));
    let mut steer = Steer::new(
        s.partitions,
        SteerConfig {
            move_timeout: s.move_timeout.as_nanos() as u64,
            hold: s.hold,
        },
    );
    let mut stats = RootStats::default();
    let mut batch = PacketBatch::new(64, MAX_FRAME);
    let mut ctl: Vec<Control> = Vec::new();
    let mut rbuf = vec![0u8; 65536];
    let fd = raw(&data);
    let mut tx = Datagrams::new(256, meta::HEADER_LEN + MAX_FRAME);
    let mut rx = Datagrams::new(256, meta::HEADER_LEN + MAX_FRAME);
    let mut last_clock = vec![0u64; s.partitions as usize];
    let mut clock = 0u64;
    let mut next_stats = Instant::now();
    let mut next_tick = Instant::now();
    let fds: Vec<_> = source.fds().chain([raw(&data), raw(&control)]).collect();
    tracing::info!(partitions = s.partitions, address = %s.address, "root up");
    while !stop.stopped() {
        flowstate_io::afpacket::wait_readable(&fds, Duration::from_millis(5)).map_err(io)?;
        let now = wall_ns();
        // The controller's assignment.
        loop {
            match control.recv_from(&mut rbuf) {
                Ok((n, _)) => {
                    if let Ok(a) = Assignment::decode(&rbuf[..n]) {
                        steer.apply(&a, now, &mut ctl);
                        leave_fast_path(&mut fast, &ctl);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        send_controls(fd, &mut tx, &mut ctl, &mut stats);
        // Packets from the ports to their owners.
        for _ in 0..16 {
            batch.clear();
            if source.recv_ready(&mut batch).map_err(io)? == 0 {
                break;
            }
            for (frame, fm) in batch.iter() {
                stats.received += 1;
                let Ok(d) = flowstate_wire::dissect(frame) else {
                    stats.malformed += 1;
                    continue;
                };
                let p = steering.worker(frame, &d) as u32;
                let direction = steering.direction(&d);
                clock += 1;
                if let Some(f) = &mut fast {
                    f.sent(clock, fm.port, frame);
                }
                match steer.route(p) {
                    Route::Send { to, epoch } => {
                        let m = Meta {
                            kind: Kind::Data,
                            stage: 0,
                            partition: p as u16,
                            epoch,
                            direction,
                            clock,
                        };
                        queue(fd, &mut tx, &m, frame, to, &mut stats);
                    }
                    Route::Hold => {
                        steer.hold(p, frame, direction, clock);
                    }
                    Route::NoOwner => steer.count_no_owner(),
                }
            }
            flush(fd, &mut tx, &mut stats);
        }
        // Frames from the instances: output, and the move protocol.
        for _ in 0..4 {
            rx.clear();
            if rx.recv(fd)? == 0 {
                break;
            }
            for i in 0..rx.len() {
                let (datagram, from) = rx.get(i);
                let Ok((m, payload)) = meta::read(datagram) else {
                    stats.bad_frames += 1;
                    continue;
                };
                if m.kind == Kind::Data {
                    let k = usize::from(m.partition) % last_clock.len();
                    let last = &mut last_clock[k];
                    if m.clock < *last {
                        stats.reordered += 1;
                    } else {
                        *last = m.clock;
                    }
                    stats.from_instances += 1;
                    let sent = sink.forward(payload).map_err(io)?;
                    // Learnt only from the current owner of a steady partition: output of a
                    // moving partition's old owner would put its flows back on the fast path.
                    let steady = matches!(steer.route(u32::from(m.partition)),
                        Route::Send { epoch, .. } if epoch == m.epoch);
                    if let (Some(f), Some((port, output)), true) = (&mut fast, sent, steady) {
                        f.returned(m.clock, m.partition, port, output);
                    }
                    continue;
                }
                let Some(id) = steer.member_at(from) else {
                    stats.bad_frames += 1;
                    continue;
                };
                // The old owner's output went before its Released: send it out first.
                sink.flush().map_err(io)?;
                if let Some((to, epoch, held)) =
                    steer.on_control(id, m.kind, m.partition, m.epoch, wall_ns(), &mut ctl)
                {
                    for h in &held {
                        let hm = Meta {
                            kind: Kind::Data,
                            stage: 0,
                            partition: m.partition,
                            epoch,
                            direction: h.direction,
                            clock: h.clock,
                        };
                        queue(fd, &mut tx, &hm, &h.frame, to, &mut stats);
                    }
                    steer.recycle(held);
                }
            }
            // The claims (and held packets) the batch's answers call for, sent together.
            leave_fast_path(&mut fast, &ctl);
            send_controls(fd, &mut tx, &mut ctl, &mut stats);
            if rx.len() < 256 {
                break;
            }
        }
        sink.flush().map_err(io)?;
        if Instant::now() >= next_tick {
            next_tick += Duration::from_millis(10);
            steer.tick(now, &mut ctl);
            leave_fast_path(&mut fast, &ctl);
            send_controls(fd, &mut tx, &mut ctl, &mut stats);
        }
        if Instant::now() >= next_stats {
            next_stats += Duration::from_millis(200);
            fill(&mut stats, &steer, fast.as_ref());
            if let Some(f) = &o.stats_file {
                crate::write_json(f, &stats);
            }
        }
    }
    fill(&mut stats, &steer, fast.as_ref());
    if let Some(f) = &o.stats_file {
        crate::write_json(f, &stats);
    }
    Ok(stats)
}

fn raw(s: &std::net::UdpSocket) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    s.as_raw_fd()
}

fn fill(stats: &mut RootStats, steer: &Steer, fast: Option<&RootFastPath>) {
    stats.steer = steer.stats();
    stats.fast = fast.map(RootFastPath::stats).unwrap_or_default();
    stats.moving = steer.moving() as u64;
    stats.assignment_version = steer.version();
    let mut times: Vec<u64> = steer.move_times().collect();
    times.sort_unstable();
    stats.move_ms_p50 = times.get(times.len() / 2).map_or(0.0, |&t| t as f64 / 1e6);
}

/// Partitions whose planned move begins (a release in `ctl`) leave the fast path first, so
/// their packets are held in order with the others ([`crate::fast`]).
fn leave_fast_path(fast: &mut Option<RootFastPath>, ctl: &[Control]) {
    let Some(f) = fast else { return };
    for c in ctl.iter().filter(|c| c.kind == Kind::Release) {
        f.moving(c.partition);
    }
}

/// Queues a frame for an instance (sending the queue first when it is full).
fn queue(
    fd: std::os::fd::RawFd,
    tx: &mut Datagrams,
    m: &Meta,
    payload: &[u8],
    to: SocketAddrV4,
    stats: &mut RootStats,
) {
    if tx.is_full() {
        flush(fd, tx, stats);
    }
    tx.push_with(to, |buf| {
        let Some(h) = meta::write(buf, m) else {
            return 0;
        };
        let n = (h + payload.len()).min(buf.len());
        buf[h..n].copy_from_slice(&payload[..n - h]);
        n
    });
    if m.kind == Kind::Data {
        stats.to_instances += 1;
    }
}

/// Sends the queued frames, in order.
fn flush(fd: std::os::fd::RawFd, tx: &mut Datagrams, stats: &mut RootStats) {
    let n = tx.len();
    let sent = tx.send(fd, |_| true).unwrap_or(0);
    stats.send_errors += (n - sent) as u64;
    tx.clear();
}

/// Queues the move protocol's frames behind the data queued before them, and sends.
fn send_controls(
    fd: std::os::fd::RawFd,
    tx: &mut Datagrams,
    ctl: &mut Vec<Control>,
    stats: &mut RootStats,
) {
    for c in ctl.drain(..) {
        let m = Meta {
            kind: c.kind,
            stage: 0,
            partition: c.partition,
            epoch: c.epoch,
            direction: flowstate_nf::Direction::Outbound,
            clock: 0,
        };
        queue(fd, tx, &m, &[], c.to, stats);
    }
    flush(fd, tx, stats);
}
