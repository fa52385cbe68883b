//! The two-port box: live interfaces in and out of the chain.
//!
//! ```text
//!  one worker (default): run to completion, one thread
//!  inside hosts --port 0--> [worker: poll both ports -> chain -> route -> sendmmsg] --port 1--> outside hosts
//!               <-------------------------------------------------------------------
//!
//!  several workers: dispatcher -> workers -> output thread
//!  inside hosts --port 0--> [LiveSource] -> dispatcher -> workers -> [LiveSink] --port 1--> outside hosts
//! ```
//!
//! The box is an IPv4 router with two ports and no kernel addresses: its neighbour side
//! (ARP, ICMP errors, routing between the ports) is [`flowstate_router`]'s.
//! * Receiving is AF_PACKET (a TPACKET_V2 ring: each frame is handed over, and wakes the
//!   box, as soon as the kernel wrote it; TPACKET_V3's block retire timeout would hold a slow
//!   flow's frames, a TCP connection's ACKs, for a millisecond or more) or AF_XDP
//!   (`driver = "af-xdp"`: an XDP program redirects each port's queue 0 to an XDP socket, so
//!   the kernel stack never sees the frames); sending is AF_PACKET `sendmmsg` in both cases.
//! * **Run to completion** with one worker (the default for a live box): the worker's thread
//!   owns both ports' sockets, waits in `poll` on both (no busy spinning: the hosts' own
//!   processes and the kernel need the cores), takes what is ready (up to a batch), runs the
//!   chain, and sends the forwarded frames itself, one `sendmmsg` per port and batch. No
//!   dispatcher, no output thread, no hand-off, no allocation per packet.
//! * With several workers (`[runtime] workers = N`), one dispatcher thread reads both ports
//!   and steers each packet by flowstate's symmetric hash and state ownership
//!   ([`crate::steer`], [`crate::owners`]) to its worker, and one output thread sends. The
//!   kernel's own spreading cannot replace the dispatcher: `PACKET_FANOUT_HASH` (and RSS on
//!   a NIC) hashes the 5-tuple as it is on the wire, which for a NAT differs between the two
//!   directions (the inbound packet is addressed to the external address and port), and it
//!   knows nothing of which worker owns a NAT port or an LB connection; a flow's two
//!   directions would reach different workers, and state owned by one would be missed by the
//!   other. Hence one worker by default: on a small machine the cores are better spent on
//!   the kernel's share of forwarding (on veth the whole receiving host's stack runs in the
//!   sender's system call) than on more threads.
//! * An XDP socket belongs to one queue and the receiving and sending threads of the
//!   several-worker mode would have to share it under a lock, hence AF_PACKET for sending;
//!   [`flowstate_io::afxdp::AfXdp`] sends too, for single-threaded users.
//! * **The XDP fast path** (`[input] fast_path`, on by default; [`flowstate_fastpath::flowcache`]):
//!   with one worker and a chain whose every NF allows it, an XDP program on both ports
//!   forwards established flows itself. The worker teaches it: it keeps a copy of each
//!   received frame and, for each frame the chain forwarded, hands both frames to
//!   [`XdpFlowCache::observe`], which installs an entry only when the entry reproduces the
//!   outgoing frame exactly. Frames the program does not take go to the XDP socket (af-xdp)
//!   or on to the kernel, where the AF_PACKET ring gets them (af-packet).
//! * [`Stop`] ends the source: the runtime then drains its workers and flushes their state,
//!   which is the graceful stop `flowstate run` performs on SIGINT and SIGTERM.
//!
//! Jumbo frames (an MTU of 9,000 and more) cross on AF_PACKET when `[runtime] max_frame`
//! holds them; a port whose MTU makes frames the box cannot hold is refused at start (AF_XDP's
//! buffers hold 1,792 bytes).
//!
//! VLAN-tagged frames (802.1Q, one tag) cross with their tag (`flowstate_router`).
//!
//! IPv6 crosses the ports given an IPv6 address (`flowstate_router`: neighbour discovery,
//! ICMPv6 errors).
//!
//! Limits: IPv6 on a port without `address6` is dropped as not for the box; no ICMP
//! host unreachable for an unknown neighbour; no fragmentation; several workers go through the
//! dispatcher and output threads (see above); time (NAT and firewall timeouts) advances
//! with packets, so an idle box expires nothing until traffic resumes, and a stage that fails
//! while the ports are idle ends the run at the next packet or signal.

use crate::RunError;
use flowstate_fastpath::flowcache::XdpFlowCache;
use flowstate_io::afxdp::XdpProgram;
use flowstate_io::{PacketBatch, Port, Source};
use flowstate_router::{
    attach_fast_path, interface_mtu, Driver, LivePort, LiveSink, LiveSource, LoadedFastPath,
    PortAddr, Shared, Stop,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Both sides of the box in one worker's hands (run to completion: the worker receives, runs
/// the chain and sends, with no thread in between).
pub struct LiveWorker<R: Port, T: Port> {
    source: LiveSource<R>,
    sink: LiveSink<T>,
    fast: Option<Learner>,
}

/// What the fast path learns from: each packet as it came in, before the chain changed it, and
/// as it went out.
struct Learner {
    path: Arc<XdpFlowCache>,
    /// The ports' interface indexes.
    ifindex: [u32; 2],
    received: PacketBatch,
}

impl<R: Port, T: Port> std::fmt::Debug for LiveWorker<R, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveWorker")
            .field("addrs", self.source.addrs())
            .finish_non_exhaustive()
    }
}

impl<R: Port, T: Port> LiveWorker<R, T> {
    /// The worker's receiving and sending sides.
    pub fn new(source: LiveSource<R>, sink: LiveSink<T>) -> Self {
        LiveWorker {
            source,
            sink,
            fast: None,
        }
    }

    /// Teaches `path` every flow the chain forwards (ports' interface indexes `ifindex`;
    /// batches of up to `batch` frames of `max_frame` bytes).
    pub fn with_fast_path(
        mut self,
        path: Arc<XdpFlowCache>,
        ifindex: [u32; 2],
        batch: usize,
        max_frame: usize,
    ) -> Self {
        self.fast = Some(Learner {
            path,
            ifindex,
            received: PacketBatch::new(batch.max(1), max_frame),
        });
        self
    }
}

impl<R: Port, T: Port> Source for LiveWorker<R, T> {
    /// As [`LiveSource`]'s.
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        let n = self.source.recv(batch)?;
        if let Some(l) = &mut self.fast {
            l.received.clear();
            for (data, meta) in batch.iter() {
                l.received.push(data, *meta);
            }
        }
        Ok(n)
    }

    fn idle_now(&mut self) -> Option<u64> {
        self.source.idle_now()
    }
}

impl<R: Port, T: Port> crate::WorkerSink for LiveWorker<R, T> {
    fn forward(&mut self, frame: &[u8], input: Option<usize>) -> flowstate_io::Result<()> {
        let Some((p, sent)) = self.sink.forward(frame)? else {
            return Ok(());
        };
        let (Some(l), Some(i)) = (&self.fast, input) else {
            return Ok(());
        };
        let Some((received, meta)) = l.received.get(i) else {
            return Ok(());
        };
        let Some(&in_if) = l.ifindex.get(usize::from(meta.port)) else {
            return Ok(());
        };
        if let Err(e) = l.path.observe(in_if, received, l.ifindex[p], sent) {
            let stats = &self.sink.shared().stats;
            if stats.fast_path_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(error = %e, "the fast path refused an entry; its flow stays on the slow path");
            }
        }
        Ok(())
    }

    fn flush_forwarded(&mut self) -> flowstate_io::Result<()> {
        self.sink.flush()
    }
}

/// Runs `runtime` as a live box between the ports `inside` and `outside` until
/// `stop` (or a signal, once [`Stop::on_signals`] ran): opens the ports, runs, and returns the
/// summary after every worker has drained and flushed its state.
pub fn run(
    runtime: &crate::Runtime,
    inside: &LivePort,
    outside: &LivePort,
    stop: Stop,
    progress: Option<crate::Progress<'_>>,
) -> Result<crate::Summary, RunError> {
    use flowstate_io::afpacket::{AfPacket, AfPacketOptions};
    use flowstate_io::afxdp::{AfXdp, AfXdpOptions};
    fits_frames(runtime, inside, outside)?;
    // The box's own frames need no queueing discipline (a veth has none anyway) and no copy
    // for the sending host's taps.
    let tx = AfPacketOptions {
        receive: false,
        qdisc_bypass: true,
        ..AfPacketOptions::default()
    };
    let tx_ports = [
        AfPacket::open(&inside.interface, &tx).map_err(RunError::Port)?,
        AfPacket::open(&outside.interface, &tx).map_err(RunError::Port)?,
    ];
    let ports = (inside, outside);
    // The fast-path program on each port; frames it leaves alone go to the port's XDP socket
    // (af-xdp) or, with no socket registered, on to the kernel and its AF_PACKET taps.
    let (fast, programs) = fast_path(runtime, inside, outside)?.unzip();
    let learner = fast.zip(programs.as_ref().map(|p| p.each_ref().map(|p| p.ifindex())));
    match inside.driver {
        Driver::AfPacket => {
            let rx = AfPacketOptions::receiving(runtime.options().max_frame);
            let rx_ports = [
                AfPacket::open(&inside.interface, &rx).map_err(RunError::Port)?,
                AfPacket::open(&outside.interface, &rx).map_err(RunError::Port)?,
            ];
            run_ports(runtime, ports, rx_ports, tx_ports, learner, stop, progress)
        }
        Driver::AfXdp => {
            // One queue per port (veth has one); the socket of each port's queue 0.
            let open = |ifname: &str, program: Option<&Arc<XdpProgram>>| {
                let program = match program {
                    Some(p) => Arc::clone(p),
                    None => XdpProgram::attach(ifname, 1)?,
                };
                AfXdp::open(ifname, program, &AfXdpOptions::default())
            };
            let [p_in, p_out] = programs
                .as_ref()
                .map(|p| p.each_ref().map(Some))
                .unwrap_or([None, None]);
            let rx_ports = [
                open(&inside.interface, p_in).map_err(RunError::Port)?,
                open(&outside.interface, p_out).map_err(RunError::Port)?,
            ];
            run_ports(runtime, ports, rx_ports, tx_ports, learner, stop, progress)
        }
    }
}

/// Frames up to this many bytes fit an AF_XDP buffer: 2 KiB less the kernel's 256-byte XDP
/// headroom.
const AF_XDP_MAX_FRAME: usize = 2048 - 256;

/// Refuses ports whose MTU makes frames the box could not hold (they would be dropped or
/// truncated): jumbo frames need `driver = "af-packet"` with `[runtime] max_frame` at least
/// the MTU plus an Ethernet header and a VLAN tag.
fn fits_frames(
    runtime: &crate::Runtime,
    inside: &LivePort,
    outside: &LivePort,
) -> Result<(), RunError> {
    for port in [inside, outside] {
        let mtu = interface_mtu(&port.interface);
        if mtu == u16::MAX {
            continue; // not known: the port's own open says what is wrong
        }
        let frame = usize::from(mtu) + 18;
        let (name, reason) = match port.driver {
            Driver::AfXdp if frame > AF_XDP_MAX_FRAME => (
                "driver",
                format!(
                    "{}: MTU {mtu} makes frames of up to {frame} bytes, and af-xdp buffers hold \
                     {AF_XDP_MAX_FRAME}: use driver = \"af-packet\" (with [runtime] max_frame) \
                     for jumbo frames",
                    port.interface
                ),
            ),
            Driver::AfPacket if frame > runtime.options().max_frame => (
                "max_frame",
                format!(
                    "{}: MTU {mtu} makes frames of up to {frame} bytes, more than [runtime] \
                     max_frame = {}: raise it to {frame}",
                    port.interface,
                    runtime.options().max_frame
                ),
            ),
            _ => continue,
        };
        return Err(RunError::Port(flowstate_io::Error::Option { name, reason }));
    }
    Ok(())
}

/// The fast path of a box and its program on each port, when it is configured, the chain
/// allows it and the box runs to completion (the worker that runs the chain is the one that
/// teaches it).
fn fast_path(
    runtime: &crate::Runtime,
    inside: &LivePort,
    outside: &LivePort,
) -> Result<Option<LoadedFastPath>, RunError> {
    let why_not = if !runtime.fast_path_allowed() {
        Some("an NF of the chain must see every packet")
    } else if runtime.options().workers > 1 {
        Some("several workers (it needs the run-to-completion box)")
    } else {
        None
    };
    attach_fast_path(inside, outside, why_not).map_err(RunError::Port)
}

#[allow(clippy::too_many_arguments)]
fn run_ports<R: Port, T: Port>(
    runtime: &crate::Runtime,
    (inside, outside): (&LivePort, &LivePort),
    rx_ports: [R; 2],
    tx_ports: [T; 2],
    fast: Option<(Arc<XdpFlowCache>, [u32; 2])>,
    stop: Stop,
    progress: Option<crate::Progress<'_>>,
) -> Result<crate::Summary, RunError> {
    let o = runtime.options();
    let addrs = [inside, outside].map(|p| PortAddr {
        address: p.address,
        gateway: p.gateway,
        address6: p.address6,
        gateway6: p.gateway6,
        mtu: interface_mtu(&p.interface),
    });
    let shared = Arc::new(Shared::default());
    let source = LiveSource::new(rx_ports, addrs, Arc::clone(&shared), stop)
        .watch([inside.interface.clone(), outside.interface.clone()]);
    let sink = LiveSink::new(
        tx_ports,
        addrs,
        o.inside.clone(),
        Arc::clone(&shared),
        2 * o.batch,
        o.max_frame,
    );
    if let Some(o) = runtime.observer() {
        o.set_live(
            Arc::clone(&shared),
            fast.as_ref().map(|(f, _)| Arc::clone(f)),
        );
    }
    let rtc = runtime.options().workers <= 1;
    tracing::info!(
        inside = %inside.interface,
        outside = %outside.interface,
        driver = ?inside.driver,
        mode = if rtc { "run-to-completion" } else { "dispatcher" },
        "live box running; SIGINT or SIGTERM stops it"
    );
    let summary = if rtc {
        // One worker: it owns both ports (see the module documentation).
        let mut worker = LiveWorker::new(source, sink);
        if let Some((path, ifindex)) = &fast {
            worker = worker.with_fast_path(Arc::clone(path), *ifindex, o.batch, o.max_frame);
        }
        let only = std::sync::Mutex::new(Some(worker));
        runtime.run_to_completion(|_| {
            let taken = only.lock().map(|mut g| g.take()).unwrap_or(None);
            Ok(crate::Counting::new(taken, progress))
        })?
    } else {
        let mut sink = sink;
        let mut source = crate::Counting::new(Some(source), progress);
        runtime.run(&mut source, Some(&mut sink))?
    };
    if let Some((path, _)) = &fast {
        match path.stats() {
            Ok(f) => {
                let s = &shared.stats;
                s.fast_path_packets.store(f.packets, Ordering::Relaxed);
                s.fast_path_bytes.store(f.bytes, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "the fast path's counters could not be read"),
        }
    }
    tracing::info!(stats = ?shared.stats.snapshot(), "live box stopped");
    let mut summary = summary;
    summary.live_box = shared
        .stats
        .snapshot()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    Ok(summary)
}
