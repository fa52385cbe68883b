//! The root: the cluster's ingress and egress on the two ports (StatelessNF §4.2 steering,
//! CHC §4.2 root).
//!
//! ```text
//!  inside hosts --port 0--> [root: partition -> owner, clock, hold] ==GENEVE==> instance k
//!  outside hosts <--port 1-- [route out by destination]           <==GENEVE== (output)
//! ```
//!
//! * It answers ARP and routes like the live box ([`flowstate_router`]): the ports are
//!   the box's, the chain runs in the instances.
//! * Each IPv4 packet's traffic partition comes from the chain's NFs
//!   ([`flowstate_nf::steer::Owners`]) over the symmetric flow hash; it goes to the partition's
//!   owner in a GENEVE frame ([`crate::meta`]) stamped with partition, epoch, direction and a
//!   logical clock. The root numbers packets in arrival order, above [`first_clock`] of its
//!   own epoch: each root that starts takes the next epoch from a counter in the store
//!   ([`take_epoch`]; CHC §5: the root's id in the clock's high bits), so a restarted root's
//!   clocks continue above every clock before it and an NF that orders by clock (the trojan
//!   detector) is not misled.
//! * Frames coming back are sent out the port their destination says (or on to the next
//!   stage). Frames that went through the same partitions must come back in the order of
//!   their clocks: one older than one already back is counted as reordered ([`OrderCheck`]).
//! * A chain cut into stages (CHC §4.1) is steered stage by stage: a packet from the inside
//!   goes to stage 0's owner, its output to stage 1's owner, and so on, the last stage's out
//!   of the port; a packet from the outside runs the stages in reverse, as the NFs of one
//!   instance do. Each stage partitions by its own NFs, on the frame as the stage before
//!   left it, with the packet's direction and clock kept from the ingress.
//! * Every packet from a port is kept in the packet log ([`crate::log`]) until its output
//!   leaves the last stage or an instance reports it dropped ([`Kind::Done`]): when a
//!   partition's new owner is ready, what its failed owner left unfinished is replayed to it
//!   first (CHC §5.4), and an output for a packet that already left its stage is dropped
//!   (CHC §5.3), so none enters a stage or leaves the chain twice.
//! * Moves follow [`crate::steer`], per stage; the assignments come from the controller.
//! * With `[input] fast_path` (the default, when every NF allows it), established flows are
//!   forwarded by an XDP program on the ports, taught by the instances' output
//!   ([`crate::fast`]); what reaches this loop is the rest.

use crate::auth::{KeyRing, Role, Sealer, Sender, TRAILER_LEN};
use crate::config::{ClusterSection, CONTROL_PORT};
use crate::fast::{FastStats, RootFastPath};
use crate::log::{LogStats, Output, PacketLog, Released, HELD};
use crate::meta::{self, Kind, Meta};
use crate::steer::{Control, Route, Steer, SteerConfig, SteerStats};
use crate::udp::Datagrams;
use crate::{udp_socket, wall_ns, ClusterError};
use flowstate_control::cluster::{Assignment, Lag};
use flowstate_io::afpacket::{AfPacket, AfPacketOptions};
use flowstate_io::PacketBatch;
use flowstate_nf::steer::Owners;
use flowstate_nf::steer::Steering;
use flowstate_nf::Direction;
use flowstate_router::{LiveSink, LiveSource, PortAddr, Shared, Stop};
use flowstate_state::{Backend, Kind as ObjKind, ObjectKey, Op, Reply};
use serde::Serialize;
use std::io::ErrorKind;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a role looks whether its key file changed.
pub(crate) const KEY_CHECK: Duration = Duration::from_secs(1);

/// Bits of a logical clock below the root's epoch: 2^48 packets per root (325 days at
/// 10 Mpps), 2^16 roots.
pub(crate) const CLOCK_BITS: u32 = 48;

/// The store's counter of root epochs.
pub(crate) fn root_epoch_key() -> ObjectKey {
    ObjectKey::shared("cluster", ObjKind::Counter, "root_epoch")
}

/// Takes a new root epoch: one more than any root took before on this store.
pub fn take_epoch(store: &mut dyn Backend) -> Result<u64, ClusterError> {
    let mut replies = Vec::new();
    store
        .execute(
            &[Op::Add {
                key: root_epoch_key(),
                delta: 1,
            }],
            &mut replies,
        )
        .map_err(|e| ClusterError::Store(format!("taking the root's epoch: {e}")))?;
    match replies.pop() {
        Some(Reply::Int(n)) if (1..1 << (64 - CLOCK_BITS)).contains(&n) => Ok(n as u64),
        Some(Reply::Int(n)) => Err(ClusterError::Store(format!(
            "the root epoch counter is at {n}, beyond the {} a clock holds: delete \
             `cluster@Counter@root_epoch` (the clocks of roots before are then reused)",
            (1u64 << (64 - CLOCK_BITS)) - 1
        ))),
        other => Err(ClusterError::Store(format!(
            "taking the root's epoch: {other:?}"
        ))),
    }
}

/// The clock before the first packet of a root of `epoch`.
pub(crate) fn first_clock(epoch: u64) -> u64 {
    epoch << CLOCK_BITS
}

/// The root's counters, written to its stats file every 200 ms.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RootStats {
    /// The root's process (a file from a root that is gone says so).
    pub pid: u32,
    /// IPv4 frames taken from the ports.
    pub received: u64,
    /// Frames sent to instances (held ones included once sent; a frame once per stage).
    pub to_instances: u64,
    /// Frames that came back from the instances (from every stage).
    pub from_instances: u64,
    /// Frames sent out a port after the chain's last stage.
    pub sent_out: u64,
    /// Frames that do not parse (from the ports, or between stages).
    pub malformed: u64,
    /// Frames back from instances older than one already sent for their partition.
    pub reordered: u64,
    /// Frames whose order was checked ([`OrderCheck`]).
    pub order_checked: u64,
    /// Frames from instances that are not ours.
    pub bad_frames: u64,
    /// Whether datagrams between roles are authenticated (not `[cluster] unauthenticated`).
    pub authenticated: bool,
    /// The ids of the keys in use, the one that signs first.
    pub keys: Vec<u8>,
    /// Datagrams from instances and the controller taken ([`crate::auth`]).
    pub auth_accepted: u64,
    /// Datagrams refused, by reason ([`crate::auth::Rejected`]).
    pub auth_rejected: std::collections::BTreeMap<&'static str, u64>,
    /// The moves (of every stage).
    #[serde(flatten)]
    pub steer: SteerStats,
    /// Partitions moving now.
    pub moving: u64,
    /// The newest assignment applied, per stage.
    pub assignment_versions: Vec<u64>,
    /// The term of the controller whose assignment each stage applied last.
    pub assignment_terms: Vec<u64>,
    /// This root's epoch ([`take_epoch`]).
    pub root_epoch: u64,
    /// Its place in `[cluster] address`.
    pub root_index: u32,
    /// The last logical clock it gave a packet.
    pub clock: u64,
    /// From its start until it had every stage's assignment and every partition's owner
    /// ready, ms (its recovery, when it replaced a failed root: CHC §5.4); 0 until then.
    pub ready_ms: f64,
    /// Median duration of the finished moves, ms.
    pub move_ms_p50: f64,
    /// Send errors towards instances.
    pub send_errors: u64,
    /// Frames out of a port dropped because the next hop's MAC was not known yet (it is asked
    /// for; a restarted root learns it on the first packet).
    pub unresolved: u64,
    /// Frames a port refused to send.
    pub send_dropped: u64,
    /// The XDP fast path (zero when it is off).
    #[serde(flatten)]
    pub fast: FastStats,
    /// The packet log: replays and duplicates suppressed.
    #[serde(flatten)]
    pub log: LogStats,
}

/// What the root needs to run.
#[derive(Debug, Clone)]
pub struct RootOptions {
    /// The cluster.
    pub section: ClusterSection,
    /// Inside port.
    pub inside: flowstate_router::LivePort,
    /// Outside port.
    pub outside: flowstate_router::LivePort,
    /// Sources that make a packet Outbound.
    pub inside_prefixes: Vec<flowstate_config::IpNet>,
    /// Where its stats go (every 200 ms and at the end).
    pub stats: crate::StatsSink,
    /// This root's epoch ([`take_epoch`]): its clocks start at [`first_clock`] of it.
    pub epoch: u64,
    /// The keys that sign and check every datagram between roles.
    pub keys: KeyRing,
    /// The largest frame carried (`[runtime] max_frame`; jumbo frames need it raised).
    pub max_frame: usize,
}

/// One stage as the root steers it.
struct Stage {
    /// Partition of a frame (by the stage's NFs).
    steering: Steering,
    /// Owners and moves.
    steer: Steer,
    /// The move protocol's frames to send.
    ctl: Vec<Control>,
    /// The fast path's number of this stage's partition 0.
    offset: u32,
    /// Its place in the chain.
    index: u32,
}

/// The stage a packet from `direction` enters first, of `n`.
fn first_stage(direction: Direction, n: usize) -> usize {
    match direction {
        Direction::Outbound => 0,
        Direction::Inbound => n - 1,
    }
}

/// The stage after `k` for a packet from `direction`, of `n`; `None` after the last.
fn next_stage(k: usize, direction: Direction, n: usize) -> Option<usize> {
    match direction {
        Direction::Outbound => (k + 1 < n).then_some(k + 1),
        Direction::Inbound => k.checked_sub(1),
    }
}

/// The order check: frames that went through the same partitions, stage by stage, come back
/// in the order of their clocks. (Frames of one partition that came from different
/// partitions of the stage before are processed in parallel upstream: their clocks
/// interleave, and a flow's packets always share their partitions.)
///
/// The root notes, per clock, the partition each frame was last sent to, and keys the check
/// by (this hop's partition, the one before). Both tables are fixed: the hop of a frame
/// older than [`ORDER_RING`] frames is forgotten and its frame not checked; the last clocks
/// are a direct-mapped table of [`ORDER_KEYS`] keys where a new key replaces an old one (a
/// check lost, never a false alarm).
struct OrderCheck {
    /// Per clock (mod the ring): (clock, partition sent to, the one before).
    hops: Vec<(u64, u32, u32)>,
    /// (key, newest clock back).
    last: Vec<(u64, u64)>,
}

/// Frames whose hops the order check remembers.
const ORDER_RING: usize = 8192;
/// Paths the order check tracks at once.
const ORDER_KEYS: usize = 1 << 16;
/// No partition: the frame came from a port.
const FROM_PORT: u32 = u32::MAX;

impl OrderCheck {
    fn new() -> OrderCheck {
        OrderCheck {
            hops: vec![(0, FROM_PORT, FROM_PORT); ORDER_RING],
            last: vec![(u64::MAX, 0); ORDER_KEYS],
        }
    }

    /// The frame of `clock` goes to `slot` (a stage's partition, numbered across stages);
    /// `first`: from a port.
    fn sent(&mut self, clock: u64, slot: u32, first: bool) {
        let h = &mut self.hops[(clock % ORDER_RING as u64) as usize];
        let before = if first {
            FROM_PORT
        } else if h.0 == clock {
            h.1
        } else {
            return; // its earlier hop is forgotten: unchecked from now on
        };
        *h = (clock, slot, before);
    }

    /// The frame of `clock` came back from `slot`: `Some(in order)`, or `None` when it
    /// cannot be checked.
    fn back(&mut self, clock: u64, slot: u32) -> Option<bool> {
        let h = self.hops[(clock % ORDER_RING as u64) as usize];
        if h.0 != clock || h.1 != slot {
            return None;
        }
        let key = u64::from(slot) << 32 | u64::from(h.2);
        let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48;
        let e = &mut self.last[mixed as usize % ORDER_KEYS];
        if e.0 != key {
            *e = (key, clock);
            return Some(true);
        }
        let in_order = clock > e.1;
        e.1 = e.1.max(clock);
        Some(in_order)
    }
}

/// The root's sending side: what goes to the instances.
struct Out {
    fd: std::os::fd::RawFd,
    tx: Datagrams,
    /// Signs every datagram to the instances.
    seal: Sealer,
    stats: RootStats,
    fast: Option<RootFastPath>,
    order: OrderCheck,
    log: PacketLog,
}

impl Out {
    /// Sends (or holds, while it moves) `frame`, dissected as `d`, to its partition's owner in
    /// `stage`; `first`: the frame comes from a port.
    fn steer_into(
        &mut self,
        stage: &mut Stage,
        frame: &[u8],
        d: &flowstate_wire::Dissection,
        direction: Direction,
        clock: u64,
        first: bool,
    ) {
        let p = stage.steering.worker_from(frame, d, direction) as u32;
        let slot = stage.offset + p;
        self.order.sent(clock, slot, first);
        match stage.steer.route(p) {
            Route::Send { to, epoch } => {
                if let Some(f) = &mut self.fast {
                    f.routed(clock, slot, epoch);
                }
                self.log.sent(clock, stage.index, slot, epoch, frame);
                let m = Meta {
                    kind: Kind::Data,
                    stage: stage.index,
                    partition: p as u16,
                    epoch,
                    direction,
                    clock,
                    replay: false,
                };
                self.queue(&m, frame, to);
            }
            Route::Hold => {
                if stage.steer.hold(p, frame, direction, clock) {
                    self.log.sent(clock, stage.index, slot, HELD, frame);
                } else {
                    self.log.abandon(clock);
                }
            }
            Route::NoOwner => {
                stage.steer.count_no_owner();
                self.log.abandon(clock);
            }
        }
    }

    /// Queues a frame for an instance (sending the queue first when it is full).
    fn queue(&mut self, m: &Meta, payload: &[u8], to: SocketAddrV4) {
        push(
            &mut self.tx,
            self.fd,
            &self.seal,
            &mut self.stats,
            m,
            payload,
            to,
        );
    }

    /// Sends the queued frames, in order.
    fn flush(&mut self) {
        flush(&mut self.tx, self.fd, &mut self.stats);
    }

    /// Sends `stage`'s partition `p`, now steady at `epoch` with the owner at `to`, what its
    /// earlier owners left unfinished (the log's replay, CHC §5.4), then the packets held
    /// while it moved.
    fn resume(
        &mut self,
        stage: &mut Stage,
        p: u16,
        to: SocketAddrV4,
        epoch: u32,
        held: std::collections::VecDeque<crate::steer::Held>,
    ) {
        let slot = stage.offset + u32::from(p);
        let Out {
            fd,
            tx,
            seal,
            stats,
            fast,
            log,
            ..
        } = self;
        log.replay(stage.index, slot, epoch, |clock, direction, frame| {
            if let Some(f) = fast.as_mut() {
                f.routed(clock, slot, epoch);
            }
            let m = Meta {
                kind: Kind::Data,
                stage: stage.index,
                partition: p,
                epoch,
                direction,
                clock,
                replay: true,
            };
            push(tx, *fd, seal, stats, &m, frame, to);
        });
        for h in &held {
            // (The order check noted the partition when the frame was held.)
            if let Some(f) = &mut self.fast {
                f.routed(h.clock, slot, epoch);
            }
            self.log.released(h.clock, epoch);
            let m = Meta {
                kind: Kind::Data,
                stage: stage.index,
                partition: p,
                epoch,
                direction: h.direction,
                clock: h.clock,
                replay: false,
            };
            self.queue(&m, &h.frame, to);
        }
        stage.steer.recycle(held);
    }

    /// Queues every stage's move-protocol frames behind the data queued before them, and
    /// sends. Partitions whose planned move begins (a release) leave the fast path first, so
    /// their packets are held in order with the others ([`crate::fast`]).
    fn controls(&mut self, stages: &mut [Stage]) {
        for (k, st) in stages.iter_mut().enumerate() {
            for c in st.ctl.drain(..) {
                if let (Some(f), Kind::Release) = (&mut self.fast, c.kind) {
                    f.moving(st.offset + u32::from(c.partition));
                }
                let m = Meta {
                    kind: c.kind,
                    stage: k as u32,
                    partition: c.partition,
                    epoch: c.epoch,
                    direction: Direction::Outbound,
                    clock: 0,
                    replay: false,
                };
                self.queue(&m, &[], c.to);
            }
        }
        self.flush();
    }
}

/// Queues a frame for an instance on `tx` (sending the queue first when it is full).
fn push(
    tx: &mut Datagrams,
    fd: std::os::fd::RawFd,
    seal: &Sealer,
    stats: &mut RootStats,
    m: &Meta,
    payload: &[u8],
    to: SocketAddrV4,
) {
    if tx.is_full() {
        flush(tx, fd, stats);
    }
    tx.push_with(to, |buf| {
        let Some(h) = meta::write(buf, m) else {
            return 0;
        };
        let n = (h + payload.len()).min(buf.len() - TRAILER_LEN);
        buf[h..n].copy_from_slice(&payload[..n - h]);
        seal.seal(buf, n).unwrap_or(0)
    });
    if m.kind == Kind::Data {
        stats.to_instances += 1;
    }
}

/// Sends the frames queued on `tx`, in order.
fn flush(tx: &mut Datagrams, fd: std::os::fd::RawFd, stats: &mut RootStats) {
    let n = tx.len();
    let sent = tx.send(fd, |_| true).unwrap_or(0);
    stats.send_errors += (n - sent) as u64;
    tx.clear();
}

/// Runs the root of a chain cut into `stages` (each stage's NFs) until `stop`.
pub fn run_root(
    o: &RootOptions,
    stages: &[Vec<Arc<dyn flowstate_nf::NfFactory>>],
    stop: Stop,
) -> Result<RootStats, ClusterError> {
    let started = Instant::now();
    let s = &o.section;
    if stages.is_empty() {
        return Err(ClusterError::Config("the chain has no stage".into()));
    }
    let tx = AfPacketOptions {
        receive: false,
        qdisc_bypass: true,
        ..AfPacketOptions::default()
    };
    let io = |e: flowstate_io::Error| ClusterError::Io(std::io::Error::other(e.to_string()));
    // The largest frame carried, and the largest datagram to or from an instance.
    let max_frame = o.max_frame;
    let datagram = meta::HEADER_LEN + max_frame + TRAILER_LEN;
    let rx = AfPacketOptions::receiving(max_frame);
    let rx_ports = [
        AfPacket::open(&o.inside.interface, &rx).map_err(io)?,
        AfPacket::open(&o.outside.interface, &rx).map_err(io)?,
    ];
    let tx_ports = [
        AfPacket::open(&o.inside.interface, &tx).map_err(io)?,
        AfPacket::open(&o.outside.interface, &tx).map_err(io)?,
    ];
    let addrs = [
        PortAddr {
            address: o.inside.address,
            gateway: o.inside.gateway,
            address6: o.inside.address6,
            gateway6: o.inside.gateway6,
            mtu: flowstate_router::interface_mtu(&o.inside.interface),
        },
        PortAddr {
            address: o.outside.address,
            gateway: o.outside.gateway,
            address6: o.outside.address6,
            gateway6: o.outside.gateway6,
            mtu: flowstate_router::interface_mtu(&o.outside.interface),
        },
    ];
    let shared = Arc::new(Shared::default());
    let mut source = LiveSource::new(rx_ports, addrs, Arc::clone(&shared), stop.clone());
    let mut offset = 0;
    let mut path: Vec<Stage> = (0u32..)
        .zip(stages)
        .map(|(k, chain)| {
            let partitions = s.stage(k).partitions;
            let st = Stage {
                steering: Steering::new(o.inside_prefixes.clone(), partitions as usize)
                    .with_owners(Owners::new(chain)),
                steer: Steer::new(
                    partitions,
                    SteerConfig {
                        move_timeout: s.move_timeout.as_nanos() as u64,
                        hold: s.hold,
                    },
                ),
                ctl: Vec::new(),
                offset,
                index: k,
            };
            offset += partitions;
            st
        })
        .collect();
    let n = path.len();
    // The fast path, when the chain allows it (every NF does) and the kernel takes it.
    let allowed = stages.iter().flatten().all(|f| f.fast_path());
    let why_not = if !allowed {
        Some("an NF of the chain must see every packet")
    } else if n > crate::fast::MAX_STAGES {
        Some("the chain has more stages than the root's fast path records")
    } else {
        None
    };
    let fast = flowstate_router::attach_fast_path(&o.inside, &o.outside, why_not)
        .map_err(|e| ClusterError::Config(e.to_string()))?
        .map(|loaded| {
            let capacity = o.inside.fast_path.map_or(0, |c| c.capacity);
            RootFastPath::new(loaded, offset, capacity, max_frame)
        });
    let mut sink = LiveSink::new(
        tx_ports,
        addrs,
        o.inside_prefixes.clone(),
        Arc::clone(&shared),
        64,
        max_frame,
    );
    let at = |port| -> Vec<SocketAddrV4> {
        s.roots
            .iter()
            .map(|a| SocketAddrV4::new(*a, port))
            .collect()
    };
    let (index, data) = crate::bind_first_own(&at(meta::PORT), "cluster.address")?;
    let control = udp_socket(at(CONTROL_PORT)[index as usize])?;
    let mut out = Out {
        fd: raw(&data),
        tx: Datagrams::new(256, datagram),
        seal: o.keys.sealer(Sender::root(index), wall_ns())?,
        stats: RootStats::default(),
        fast,
        order: OrderCheck::new(),
        log: PacketLog::new(s.log_packets, offset),
    };
    let mut batch = PacketBatch::new(64, max_frame);
    let mut rbuf = vec![0u8; 65536];
    let mut rx = Datagrams::new(256, datagram);
    let mut opener = o.keys.opener(s.clock_skew.as_nanos() as u64);
    let mut next_keys = Instant::now();
    // An output the packet log released, on its way on.
    let mut kept = Vec::with_capacity(max_frame);
    let mut clock = first_clock(o.epoch);
    out.stats.root_epoch = o.epoch;
    out.stats.root_index = index;
    out.stats.authenticated = o.keys.authenticated();
    out.stats.pid = std::process::id();
    let mut next_stats = Instant::now();
    let mut next_tick = Instant::now();
    let mut next_lag = Instant::now();
    let controllers = s.controllers_at();
    let fds: Vec<_> = source.fds().chain([raw(&data), raw(&control)]).collect();
    let address = s.roots[index as usize];
    tracing::info!(stages = n, partitions = offset, %address, index, epoch = o.epoch, "root up");
    while !stop.stopped() {
        flowstate_io::afpacket::wait_readable(&fds, Duration::from_millis(5)).map_err(io)?;
        let now = wall_ns();
        out.log.set_now(now);
        // The controller's assignments.
        loop {
            match control.recv_from(&mut rbuf) {
                Ok((len, _)) => {
                    let Ok((from, body)) = opener.open(&mut rbuf[..len], now) else {
                        continue;
                    };
                    if from.role != Role::Controller {
                        opener.refuse();
                        continue;
                    }
                    if let Ok(a) = Assignment::decode(body) {
                        if let Some(st) = path.get_mut(a.stage as usize) {
                            st.steer.apply(&a, now, &mut st.ctl);
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        out.controls(&mut path);
        // Packets from the ports to their owners in the first stage.
        for _ in 0..16 {
            batch.clear();
            if source.recv_ready(&mut batch).map_err(io)? == 0 {
                break;
            }
            for (frame, fm) in batch.iter() {
                out.stats.received += 1;
                let Ok(d) = flowstate_wire::dissect(frame) else {
                    out.stats.malformed += 1;
                    continue;
                };
                let direction = path[0].steering.direction(&d);
                clock += 1;
                out.log.log(clock, direction);
                if let Some(f) = &mut out.fast {
                    f.sent(clock, fm.port, frame);
                }
                let k = first_stage(direction, n);
                out.steer_into(&mut path[k], frame, &d, direction, clock, true);
            }
            out.flush();
        }
        // Frames from the instances: output (to the next stage, or out), and the moves.
        for _ in 0..4 {
            rx.clear();
            if rx.recv(out.fd)? == 0 {
                break;
            }
            for i in 0..rx.len() {
                let from = rx.get(i).1;
                let Ok((sender, datagram)) = opener.open(rx.get_mut(i), now) else {
                    continue;
                };
                let Ok((m, payload)) = meta::read(datagram) else {
                    out.stats.bad_frames += 1;
                    continue;
                };
                let k = m.stage as usize;
                let Some(st) = path.get_mut(k) else {
                    out.stats.bad_frames += 1;
                    continue;
                };
                // Only the stage's members send its output and answers.
                if sender.role != Role::Instance || !st.steer.is_member(sender.id) {
                    opener.refuse();
                    continue;
                }
                match m.kind {
                    Kind::Done => {
                        // Delete requests: an NF dropped these packets, their state is stored.
                        for (clock, epoch) in meta::read_notice(payload) {
                            out.log.delete(clock, m.stage, epoch);
                        }
                        continue;
                    }
                    Kind::Through if u32::from(m.partition) < st.steer.partitions() => {
                        // A quiet partition's watermark: what its lost notices held goes on.
                        let slot = st.offset + u32::from(m.partition);
                        while let Some((c, r)) =
                            out.log.through(m.stage, slot, m.epoch, m.clock, &mut kept)
                        {
                            let hop = Hop {
                                stage: k,
                                clock: c,
                                released: r,
                            };
                            deliver(&mut out, &mut path, &mut sink, hop, &kept).map_err(io)?;
                        }
                        continue;
                    }
                    Kind::Committed => {
                        // The outputs these packets' commit held back go on.
                        for (clock, epoch) in meta::read_notice(payload) {
                            // Earlier outputs whose notices were lost come first.
                            while let Some((c, r)) =
                                out.log.committed(clock, m.stage, epoch, &mut kept)
                            {
                                let hop = Hop {
                                    stage: k,
                                    clock: c,
                                    released: r,
                                };
                                deliver(&mut out, &mut path, &mut sink, hop, &kept).map_err(io)?;
                                if c == clock {
                                    break;
                                }
                            }
                        }
                        continue;
                    }
                    Kind::Data => {
                        out.stats.from_instances += 1;
                        if out.log.output(m.clock, m.stage, m.epoch, payload) == Output::Unlogged {
                            let released = Released {
                                direction: m.direction,
                                slot: st.offset + u32::from(m.partition),
                            };
                            let hop = Hop {
                                stage: k,
                                clock: m.clock,
                                released,
                            };
                            deliver(&mut out, &mut path, &mut sink, hop, payload).map_err(io)?;
                        }
                        continue;
                    }
                    _ => {}
                }
                // A move's answer comes from the member's published address too.
                let Some(id) = st.steer.member_at(from).filter(|&id| id == sender.id) else {
                    opener.refuse();
                    continue;
                };
                // The old owner's output went before its Released: send it out first.
                sink.flush().map_err(io)?;
                if let Some((to, epoch, held)) =
                    st.steer
                        .on_control(id, m.kind, m.partition, m.epoch, wall_ns(), &mut st.ctl)
                {
                    out.resume(st, m.partition, to, epoch, held);
                }
            }
            // Frames for the next stages, and the claims (and held packets) the batch's
            // answers call for, sent together.
            out.controls(&mut path);
            if rx.len() < 256 {
                break;
            }
        }
        sink.flush().map_err(io)?;
        if out.stats.ready_ms == 0.0
            && path
                .iter()
                .all(|st| st.steer.version() > 0 && st.steer.moving() == 0)
        {
            out.stats.ready_ms = (started.elapsed().as_secs_f64() * 1e3).max(1e-3);
            tracing::info!(ready_ms = out.stats.ready_ms, "root ready");
        }
        if Instant::now() >= next_tick {
            next_tick += Duration::from_millis(10);
            for st in &mut path {
                st.steer.tick(now, &mut st.ctl);
            }
            out.controls(&mut path);
        }
        if Instant::now() >= next_lag {
            // How long each instance's packets wait, for the controller's straggler rule.
            next_lag = Instant::now() + s.heartbeat;
            out.log.set_now(wall_ns());
            for lag in lags(&mut out.log, &path) {
                let d = out.seal.sealed(lag.encode());
                for to in &controllers {
                    let _ = control.send_to(&d, to);
                }
            }
        }
        if Instant::now() >= next_keys {
            next_keys = Instant::now() + KEY_CHECK;
            o.keys.reload_if_changed();
            crate::still_here(address, &[&o.inside.interface, &o.outside.interface])?;
        }
        if Instant::now() >= next_stats {
            next_stats += Duration::from_millis(200);
            out.stats.auth_accepted = opener.accepted();
            out.stats.auth_rejected = opener.rejected().by_name();
            out.stats.keys = o.keys.ids();
            out.stats.clock = clock;
            fill(&mut out, &path, &shared);
            o.stats.publish(&out.stats);
        }
    }
    out.stats.clock = clock;
    out.stats.auth_accepted = opener.accepted();
    out.stats.auth_rejected = opener.rejected().by_name();
    fill(&mut out, &path, &shared);
    o.stats.publish(&out.stats);
    Ok(out.stats)
}

/// Each stage's [`Lag`] report: per owner, the longest wait of a packet at any of its
/// partitions ([`PacketLog::waits`]).
fn lags(log: &mut PacketLog, path: &[Stage]) -> Vec<Lag> {
    let mut out: Vec<Lag> = path
        .iter()
        .map(|st| Lag {
            stage: st.index,
            lags: Vec::new(),
        })
        .collect();
    log.waits(|slot, ns| {
        let Some(st) = path.iter().rev().find(|st| st.offset <= slot) else {
            return;
        };
        let Some((id, _)) = st.steer.owner(slot - st.offset) else {
            return;
        };
        let lags = &mut out[st.index as usize].lags;
        match lags.iter_mut().find(|(i, _)| *i == id) {
            Some(l) => l.1 = l.1.max(ns),
            None => lags.push((id, ns)),
        }
    });
    out
}

/// Where an output comes from.
struct Hop {
    /// The stage whose output it is.
    stage: usize,
    /// Its packet's clock.
    clock: u64,
    /// Its packet's direction and the stage's partition.
    released: Released,
}

/// Passes on a stage's output `payload`: to the next stage's owner, or out of the chain.
fn deliver<P: flowstate_io::Port>(
    out: &mut Out,
    path: &mut [Stage],
    sink: &mut LiveSink<P>,
    hop: Hop,
    payload: &[u8],
) -> flowstate_io::Result<()> {
    let Hop {
        stage: k,
        clock,
        released: Released { direction, slot },
    } = hop;
    match out.order.back(clock, slot) {
        Some(true) => out.stats.order_checked += 1,
        Some(false) => {
            out.stats.order_checked += 1;
            out.stats.reordered += 1;
        }
        None => {}
    }
    if let Some(j) = next_stage(k, direction, path.len()) {
        match flowstate_wire::dissect(payload) {
            Ok(d) => out.steer_into(&mut path[j], payload, &d, direction, clock, false),
            Err(_) => out.stats.malformed += 1,
        }
        return Ok(());
    }
    out.stats.sent_out += 1;
    out.log.finish(clock);
    let sent = sink.forward(payload)?;
    if let (Some(f), Some((port, output))) = (&mut out.fast, sent) {
        // Learnt only if every stage's partition is still where the frame went: output of a
        // moving partition's old owner would put its flows back on the fast path.
        let steady = |slot: u32, epoch: u32| {
            path.iter()
                .rev()
                .find(|st| st.offset <= slot)
                .is_some_and(|st| {
                    matches!(st.steer.route(slot - st.offset),
                    Route::Send { epoch: e, .. } if e == epoch)
                })
        };
        f.returned(clock, port, output, steady);
    }
    Ok(())
}

fn raw(s: &std::net::UdpSocket) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    s.as_raw_fd()
}

fn fill(out: &mut Out, path: &[Stage], shared: &Shared) {
    let stats = &mut out.stats;
    let ports = &shared.stats;
    stats.unresolved = ports.unresolved.load(std::sync::atomic::Ordering::Relaxed);
    stats.send_dropped = ports
        .send_dropped
        .load(std::sync::atomic::Ordering::Relaxed);
    stats.steer = SteerStats::default();
    for st in path {
        stats.steer += st.steer.stats();
    }
    stats.fast = out
        .fast
        .as_ref()
        .map(RootFastPath::stats)
        .unwrap_or_default();
    stats.log = out.log.stats();
    stats.moving = path.iter().map(|st| st.steer.moving() as u64).sum();
    stats.assignment_versions = path.iter().map(|st| st.steer.version()).collect();
    stats.assignment_terms = path.iter().map(|st| st.steer.term()).collect();
    let mut times: Vec<u64> = path.iter().flat_map(|st| st.steer.move_times()).collect();
    times.sort_unstable();
    stats.move_ms_p50 = times.get(times.len() / 2).map_or(0.0, |&t| t as f64 / 1e6);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbound_runs_the_stages_in_order_and_inbound_in_reverse() {
        let walk = |d: Direction, n: usize| {
            let mut k = Some(first_stage(d, n));
            let mut seen = Vec::new();
            while let Some(s) = k {
                seen.push(s);
                k = next_stage(s, d, n);
            }
            seen
        };
        assert_eq!(walk(Direction::Outbound, 3), [0, 1, 2]);
        assert_eq!(walk(Direction::Inbound, 3), [2, 1, 0]);
        assert_eq!(walk(Direction::Inbound, 1), [0]);
    }

    #[test]
    fn each_root_takes_a_new_epoch_and_its_clocks_start_above_the_last_root_s() {
        use flowstate_state::Connector;
        let store = flowstate_state::local::LocalStore::new();
        let mut b = store.connect().unwrap();
        let (e1, e2) = (
            take_epoch(b.as_mut()).unwrap(),
            take_epoch(b.as_mut()).unwrap(),
        );
        assert_eq!((e1, e2), (1, 2));
        // Every clock the first root can give lies below the second root's first.
        assert_eq!(first_clock(e2) - first_clock(e1), 1 << CLOCK_BITS);
        let mut replies = Vec::new();
        b.execute(
            &[Op::Add {
                key: root_epoch_key(),
                delta: (1 << 16) - 3,
            }],
            &mut replies,
        )
        .unwrap();
        let e = take_epoch(b.as_mut()).unwrap_err();
        assert!(e.to_string().contains("root_epoch"), "{e}");
    }

    #[test]
    fn the_order_check_compares_frames_of_the_same_path_only() {
        let mut o = OrderCheck::new();
        // Clocks 1 and 2 from the port to partition 5, then 2 comes back first: reordered.
        o.sent(1, 5, true);
        o.sent(2, 5, true);
        assert_eq!(o.back(2, 5), Some(true));
        assert_eq!(o.back(1, 5), Some(false));
        // Clock 3 via partition 7 and clock 4 via partition 8 both go on to partition 20:
        // they came from different partitions, so their order at 20 is free.
        o.sent(3, 7, true);
        o.sent(4, 8, true);
        assert_eq!(o.back(4, 8), Some(true));
        o.sent(4, 20, false);
        assert_eq!(o.back(3, 7), Some(true));
        o.sent(3, 20, false);
        assert_eq!(o.back(4, 20), Some(true));
        assert_eq!(o.back(3, 20), Some(true));
        // A frame back from a partition it was not sent to, or forgotten, is not checked.
        assert_eq!(o.back(3, 21), None);
        o.sent(3 + ORDER_RING as u64, 1, true);
        assert_eq!(o.back(3, 20), None);
        o.sent(3, 30, false);
        assert_eq!(o.back(3, 30), None, "its earlier hop is forgotten");
    }
}
