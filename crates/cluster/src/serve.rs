//! An instance's process: takes frames from the root, runs them through its partitions'
//! chains ([`crate::instance`]), commits their state, sends the output back; answers the move
//! protocol; applies the controller's assignments; reports to the controller every heartbeat
//! (HashMVT §IV-C: load η = busy / total time, Eq. 1).

use crate::auth::{KeyRing, Role, Sealer, Sender, TRAILER_LEN};
use crate::config::{ClusterSection, CONTROL_PORT};
use crate::instance::{Instance, InstanceConfig, InstanceStats};
use crate::meta::{self, Kind, Meta};
use crate::udp::Datagrams;
use crate::{udp_socket, wall_ns, ClusterError};
use flowstate_control::cluster::{Assignment, Report};
use flowstate_router::Stop;
use flowstate_state::Connector;
use serde::Serialize;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Datagrams taken per batch (one commit per batch).
const BATCH: usize = 64;
/// Batches taken before the loop looks at its timers again.
const TURN_BATCHES: usize = 4;
/// Largest notice datagram.
const NOTICE_DATAGRAM: usize = meta::HEADER_LEN + 2048 + TRAILER_LEN;

/// What an instance's process needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The cluster.
    pub section: ClusterSection,
    /// This instance.
    pub id: u32,
    /// The chain stage it runs (its NFs are that stage's).
    pub stage: u32,
    /// Its address on the cluster network.
    pub address: Ipv4Addr,
    /// `[state] flush_interval`.
    pub flush_interval: Duration,
    /// `[state] retain_ops`.
    pub retain_ops: usize,
    /// Where its counters go (every heartbeat and at the end).
    pub stats: crate::StatsSink,
    /// The keys that sign and check every datagram between roles.
    pub keys: KeyRing,
    /// The largest frame carried (`[runtime] max_frame`).
    pub max_frame: usize,
}

/// What the stats file holds.
#[derive(Debug, Serialize)]
struct Snapshot {
    id: u32,
    stage: u32,
    pid: u32,
    partitions: Vec<u32>,
    load: f64,
    packets: u64,
    forwarded: u64,
    dropped: u64,
    malformed: u64,
    misdirected: u64,
    claims: u64,
    refused: u64,
    releases: u64,
    fenced: u64,
    fenced_commits: u64,
    uncommitted: u64,
    commit_errors: u64,
    copied_bytes: u64,
    replayed: u64,
    replay_committed: u64,
    drop_reasons: std::collections::BTreeMap<&'static str, u64>,
    /// Whether datagrams between roles are authenticated.
    authenticated: bool,
    /// The ids of the keys in use, the one that signs first.
    keys: Vec<u8>,
    /// Datagrams from the root and the controller taken ([`crate::auth`]).
    auth_accepted: u64,
    /// Datagrams refused, by reason.
    auth_rejected: std::collections::BTreeMap<&'static str, u64>,
    /// Each NF's packets in, forwarded and dropped by reason, as in a box's summary.
    nfs: Vec<NfSnapshot>,
    assignment_version: u64,
}

/// One NF's counters in the stats file.
#[derive(Debug, Serialize)]
struct NfSnapshot {
    name: &'static str,
    packets_in: u64,
    forwarded: u64,
    dropped: std::collections::BTreeMap<&'static str, u64>,
}

/// Runs an instance until `stop`.
pub fn run_instance(
    o: &ServeOptions,
    chain: Vec<Arc<dyn flowstate_nf::NfFactory>>,
    connector: Arc<dyn Connector>,
    stop: Stop,
) -> Result<InstanceStats, ClusterError> {
    let s = &o.section;
    let mut inst = Instance::new(
        InstanceConfig {
            id: o.id,
            stage: o.stage,
            partitions: s.stage(o.stage).partitions,
            flush_interval: o.flush_interval,
            retain_ops: o.retain_ops,
            copy_on_move: s.copy_on_move,
            unfenced_store: s.unfenced_store,
        },
        chain,
        connector,
    )?;
    let data = udp_socket(SocketAddrV4::new(o.address, meta::PORT))?;
    let control = udp_socket(SocketAddrV4::new(o.address, CONTROL_PORT))?;
    let controllers = s.controllers_at();
    let seal = o.keys.sealer(Sender::instance(o.id), wall_ns())?;
    let mut opener = o.keys.opener(s.clock_skew.as_nanos() as u64);
    let mut root = Root {
        socket: &data,
        roots: s.roots.clone(),
        seen: Vec::with_capacity(MAX_ROOTS_SEEN),
        next: 0,
        stage: o.stage,
        logs: s.log_packets > 0,
        seal: &seal,
    };
    let fds = [data.as_raw_fd(), control.as_raw_fd()];
    let data_fd = data.as_raw_fd();
    let mut dg = Datagrams::new(BATCH, meta::HEADER_LEN + o.max_frame + TRAILER_LEN);
    let mut fwd = [false; BATCH];
    // Per datagram of a batch: its length without the trailer, when the root signed it.
    let mut body: [Option<usize>; BATCH] = [None; BATCH];
    // Per datagram of a batch: the root that signed it (its index).
    let mut sender = [0u32; BATCH];
    let mut cbuf = vec![0u8; 65536];
    let mut reply = [0u8; meta::HEADER_LEN + TRAILER_LEN];
    let heartbeat = s.heartbeat;
    let lease = heartbeat * s.missed;
    let (mut term, mut applied) = (0u64, 0u64);
    let beat = Heartbeat::start(data.try_clone()?, controllers, heartbeat, seal.clone())?;
    let mut next_keys = Instant::now();
    let mut busy = Duration::ZERO;
    let mut window = Instant::now();
    let mut last_load = 0.0;
    let mut next_report = Instant::now();
    let mut next_tick = Instant::now();
    let mut next_retry = Instant::now();
    let mut next_watermark = Instant::now();
    let mut last_turn = Instant::now();
    tracing::info!(id = o.id, stage = o.stage, address = %o.address, "instance up");
    beat.update(report(o, &inst, 0.0, 0));
    while !stop.stopped() {
        flowstate_io::afpacket::wait_readable(&fds, Duration::from_millis(5))
            .map_err(|e| ClusterError::Io(std::io::Error::other(e.to_string())))?;
        if last_turn.elapsed() > lease {
            // Paused past failure detection: someone may own our partitions now.
            if let Err(e) = inst.revalidate() {
                tracing::warn!("cannot check ownership after a pause: {e}");
            }
        }
        last_turn = Instant::now();
        let now = wall_ns();
        loop {
            match control.recv_from(&mut cbuf) {
                Ok((n, _)) => {
                    let Ok((from, msg)) = opener.open(&mut cbuf[..n], now) else {
                        continue;
                    };
                    if from.role != Role::Controller {
                        opener.refuse();
                        continue;
                    }
                    if let Ok(a) = Assignment::decode(msg) {
                        let fresh = crate::config::freshness(term, applied, &a);
                        if a.stage == o.stage && fresh == crate::config::Fresh::Newer {
                            inst.apply(&a, wall_ns());
                            (term, applied) = (a.term, a.version);
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        let started = Instant::now();
        let mut work = false;
        // A few batches per turn, so reports and timers keep their pace under any load.
        for _ in 0..TURN_BATCHES {
            dg.clear();
            let got = dg.recv(data_fd)?;
            if got == 0 {
                break;
            }
            work = true;
            for (j, b) in body.iter_mut().enumerate().take(got) {
                *b = match opener.open(dg.get_mut(j), now) {
                    Ok((from, msg)) if from.role == Role::Root && root.knows(from.id) => {
                        sender[j] = from.id;
                        Some(msg.len())
                    }
                    Ok(_) => {
                        opener.refuse();
                        None
                    }
                    Err(_) => None,
                };
            }
            // Datagrams from `first` on are not committed and sent yet.
            let mut first = 0;
            let mut i = 0;
            while i < got {
                fwd[i] = false;
                let Some(Ok((m, _))) = signed(&dg, &body, i).map(meta::read) else {
                    i += 1;
                    continue;
                };
                match m.kind {
                    Kind::Data => {
                        root.saw(m.clock, sender[i]);
                        let n = body[i].unwrap_or(0);
                        let payload = dg.get_mut(i).get_mut(meta::HEADER_LEN..n);
                        fwd[i] = payload.is_some_and(|p| inst.process(&m, p, now));
                        i += 1;
                    }
                    Kind::Claim | Kind::Release => {
                        // What came before the request is answered first (its output, then this).
                        beat.in_store(true);
                        finish(
                            &mut inst,
                            &root,
                            &mut dg,
                            |j| j >= first && j < i && fwd[j],
                            now,
                        );
                        beat.in_store(false);
                        // Claims that came together are taken together (one round trip for
                        // their ownership records).
                        let mut end = i + 1;
                        if m.kind == Kind::Claim {
                            while end < got && signed(&dg, &body, end).is_some_and(is_claim) {
                                fwd[end] = false;
                                end += 1;
                            }
                        }
                        let requests: Vec<Meta> = (i..end)
                            .filter_map(|j| signed(&dg, &body, j).and_then(|f| meta::read(f).ok()))
                            .map(|(m, _)| m)
                            .collect();
                        let from = dg.get(i).1;
                        let mut send = |r: &Meta, answer: Result<Kind, ClusterError>| match answer {
                            Ok(kind) => {
                                let a = Meta { kind, ..*r };
                                let h = meta::write(&mut reply, &a);
                                if let Some(n) = h.and_then(|h| seal.seal(&mut reply, h)) {
                                    let _ = data.send_to(&reply[..n], from);
                                }
                            }
                            // No answer: the root asks again after its move timeout.
                            Err(e) => {
                                tracing::warn!(partition = r.partition, "{:?} failed: {e}", r.kind)
                            }
                        };
                        if m.kind == Kind::Claim {
                            let claims: Vec<(u32, u32)> = requests
                                .iter()
                                .map(|r| (u32::from(r.partition), r.epoch))
                                .collect();
                            beat.building(true);
                            inst.claim_many(&claims, now, |k, a| {
                                send(&requests[k], a);
                                beat.building(true);
                            });
                            beat.building(false);
                        } else {
                            send(&m, inst.release(u32::from(m.partition), m.epoch, now));
                        }
                        first = end;
                        i = end;
                    }
                    _ => i += 1,
                }
            }
            // End of a batch: commit, then let its output go.
            beat.in_store(true);
            finish(&mut inst, &root, &mut dg, |j| j >= first && fwd[j], now);
            beat.in_store(false);
            if got < BATCH {
                break;
            }
        }
        if work {
            busy += started.elapsed();
        }
        if Instant::now() >= next_tick {
            next_tick += Duration::from_millis(10);
            let t = Instant::now();
            inst.tick(now);
            if t.elapsed() > Duration::from_millis(1) {
                tracing::debug!(tick_us = t.elapsed().as_micros() as u64, "slow tick");
            }
            inst.expire_leaving(now, 2 * s.move_timeout.as_nanos() as u64);
            if inst.uncommitted() && Instant::now() >= next_retry {
                next_retry = Instant::now() + COMMIT_RETRY;
                beat.in_store(true);
                commit(&mut inst, &root, now);
                beat.in_store(false);
            }
            if root.logs && Instant::now() >= next_watermark {
                next_watermark = Instant::now() + WATERMARK_EVERY;
                inst.watermarks(|p, epoch, clock| root.through(p, epoch, clock));
            }
        }
        if Instant::now() >= next_keys {
            next_keys = Instant::now() + crate::root::KEY_CHECK;
            o.keys.reload_if_changed();
            crate::still_here(o.address, &[])?;
        }
        if Instant::now() >= next_report {
            next_report = Instant::now() + heartbeat;
            let total = window.elapsed();
            last_load = (busy.as_secs_f64() / total.as_secs_f64().max(1e-9)).clamp(0.0, 1.0);
            busy = Duration::ZERO;
            window = Instant::now();
            let r = report(o, &inst, last_load, applied);
            beat.update(r);
            o.stats
                .publish(&snapshot(o, &inst, &opener, last_load, applied));
        }
        beat.alive();
    }
    beat.stop();
    o.stats
        .publish(&snapshot(o, &inst, &opener, last_load, applied));
    Ok(inst.stats())
}

/// The report of this instance (the heartbeat thread numbers it).
fn report(o: &ServeOptions, inst: &Instance, load: f64, applied: u64) -> Report {
    let st = inst.stats();
    Report {
        stage: o.stage,
        id: o.id,
        addr: SocketAddrV4::new(o.address, meta::PORT),
        pid: std::process::id(),
        seq: 0,
        load,
        partitions: inst.owned_partitions(),
        packets: st.packets,
        drops: st.dropped + st.malformed + st.misdirected,
        entries: inst.entries(),
        assignment_version: applied,
        store_trouble: st.commit_errors,
    }
}

fn snapshot(
    o: &ServeOptions,
    inst: &Instance,
    opener: &crate::auth::Opener,
    load: f64,
    applied: u64,
) -> Snapshot {
    let st = inst.stats();
    Snapshot {
        id: o.id,
        stage: o.stage,
        pid: std::process::id(),
        partitions: inst.owned_partitions(),
        load,
        packets: st.packets,
        forwarded: st.forwarded,
        dropped: st.dropped,
        malformed: st.malformed,
        misdirected: st.misdirected,
        claims: st.claims,
        refused: st.refused,
        releases: st.releases,
        fenced: st.fenced,
        fenced_commits: st.fenced_commits,
        uncommitted: st.uncommitted,
        commit_errors: st.commit_errors,
        copied_bytes: st.copied_bytes,
        replayed: st.replayed,
        replay_committed: st.replay_committed,
        drop_reasons: inst.drop_reasons(),
        authenticated: o.keys.authenticated(),
        keys: o.keys.ids(),
        auth_accepted: opener.accepted(),
        auth_rejected: opener.rejected().by_name(),
        nfs: inst
            .nf_counters()
            .into_iter()
            .map(|(name, c)| NfSnapshot {
                name,
                packets_in: c.packets_in,
                forwarded: c.forwarded,
                dropped: c.dropped.into_iter().collect(),
            })
            .collect(),
        assignment_version: applied,
    }
}

/// Datagram `j` of `dg` without its trailer, when it verified as the root's (`body`).
fn signed<'a>(dg: &'a Datagrams, body: &[Option<usize>], j: usize) -> Option<&'a [u8]> {
    body[j].map(|n| &dg.get(j).0[..n])
}

/// Whether `datagram` is a claim.
fn is_claim(datagram: &[u8]) -> bool {
    meta::read(datagram).is_ok_and(|(m, _)| m.kind == Kind::Claim)
}

/// Root clock epochs an instance remembers the root of.
const MAX_ROOTS_SEEN: usize = 16;

/// Where the roots take this instance's frames. A frame's output goes back to the address it
/// came from; a commit's notices go to the root whose clocks they carry: each root numbers
/// its packets in its own epoch (a clock's high bits, [`crate::root::CLOCK_BITS`]), learned
/// here from the packets it signed.
struct Root<'a> {
    socket: &'a std::net::UdpSocket,
    /// `[cluster] address`: the roots, by index.
    roots: Vec<Ipv4Addr>,
    /// (clock epoch, root index) of the roots seen, at most [`MAX_ROOTS_SEEN`].
    seen: Vec<(u64, u32)>,
    /// The entry of `seen` a new epoch replaces when it is full (the oldest learned).
    next: usize,
    stage: u32,
    /// Whether the root logs packets (`[cluster] log_packets`): it then takes outputs ahead
    /// of their commit and waits for the commit's notice.
    logs: bool,
    /// Signs every datagram this instance sends.
    seal: &'a Sealer,
}

impl Root<'_> {
    /// Whether root `index` is one of `[cluster] address`.
    fn knows(&self, index: u32) -> bool {
        (index as usize) < self.roots.len()
    }

    /// Root `index` sent a packet of `clock`.
    fn saw(&mut self, clock: u64, index: u32) {
        let epoch = clock >> crate::root::CLOCK_BITS;
        if let Some(e) = self.seen.iter_mut().find(|e| e.0 == epoch) {
            e.1 = index;
        } else if self.seen.len() < MAX_ROOTS_SEEN {
            self.seen.push((epoch, index));
        } else {
            self.seen[self.next] = (epoch, index);
            self.next = (self.next + 1) % MAX_ROOTS_SEEN;
        }
    }

    /// Sends a notice of `kind` about `packets` to the roots whose clocks they carry (as many
    /// frames as they take); one of an epoch no root sent here is dropped (a root restarted
    /// since, its log gone).
    fn notify(&self, kind: Kind, packets: &[meta::Notice]) {
        for &(epoch, index) in &self.seen {
            let to = SocketAddrV4::new(self.roots[index as usize], meta::PORT);
            let of = |n: &&meta::Notice| n.0 >> crate::root::CLOCK_BITS == epoch;
            if packets.iter().any(|n| of(&n)) {
                self.notify_root(kind, packets.iter().filter(of), to);
            }
        }
    }

    /// Sends the watermark of [`Kind::Through`] to the root that numbered `clock`.
    fn through(&self, partition: u16, epoch: u32, clock: u64) {
        let root = clock >> crate::root::CLOCK_BITS;
        let Some(&(_, index)) = self.seen.iter().find(|e| e.0 == root) else {
            return;
        };
        let m = Meta {
            kind: Kind::Through,
            stage: self.stage,
            partition,
            epoch,
            direction: flowstate_nf::Direction::Outbound,
            clock,
            replay: false,
        };
        let mut buf = [0u8; meta::HEADER_LEN + TRAILER_LEN];
        let to = SocketAddrV4::new(self.roots[index as usize], meta::PORT);
        if let Some(n) = meta::write(&mut buf, &m).and_then(|h| self.seal.seal(&mut buf, h)) {
            if let Err(e) = self.socket.send_to(&buf[..n], to) {
                tracing::warn!("cannot send a watermark to the root at {to}: {e}");
            }
        }
    }

    fn notify_root<'n>(
        &self,
        kind: Kind,
        mut packets: impl Iterator<Item = &'n meta::Notice>,
        to: SocketAddrV4,
    ) {
        let m = Meta {
            kind,
            stage: self.stage,
            partition: 0,
            epoch: 0,
            direction: flowstate_nf::Direction::Outbound,
            clock: 0,
            replay: false,
        };
        let mut buf = [0u8; NOTICE_DATAGRAM];
        loop {
            // Sealing encrypts the buffer: each datagram writes its header again.
            let Some(h) = meta::write(&mut buf, &m) else {
                return;
            };
            let per_frame = (buf.len() - h - TRAILER_LEN) / meta::NOTICE_ENTRY;
            let mut n = h;
            for &(clock, epoch) in packets.by_ref().take(per_frame) {
                if meta::write_notice(&mut buf[n..], clock, epoch).is_some() {
                    n += meta::NOTICE_ENTRY;
                }
            }
            if n == h {
                return;
            }
            let Some(n) = self.seal.seal(&mut buf, n) else {
                return;
            };
            if let Err(e) = self.socket.send_to(&buf[..n], to) {
                tracing::warn!("cannot send {kind:?} notices to the root at {to}: {e}");
            }
        }
    }
}

/// Commits a batch and sends the forwarded frames `pick` says yes to back where they came
/// from (the root): after the commit, or, when the root logs packets, before it, followed by
/// the commit's notices once it is acknowledged (see [`crate::log`]).
fn finish(
    inst: &mut Instance,
    root: &Root<'_>,
    dg: &mut Datagrams,
    pick: impl Fn(usize) -> bool,
    now: u64,
) {
    if dg.is_empty() {
        return;
    }
    let send = |dg: &mut Datagrams, pick: &dyn Fn(usize) -> bool| {
        // Each output goes back in the datagram it came in, signed by this instance over
        // the root's trailer.
        for j in (0..dg.len()).filter(|&j| pick(j)) {
            let d = dg.get_mut(j);
            let n = d.len() - TRAILER_LEN;
            root.seal.seal(d, n);
        }
        if let Err(e) = dg.send(root.socket.as_raw_fd(), pick) {
            tracing::warn!("cannot send to the root: {e}");
        }
    };
    // Nothing leaves the cluster that the store does not hold: on a failed commit the root
    // keeps the outputs until a later commit's notices (without a log, they are dropped and
    // the senders retransmit).
    if root.logs {
        send(dg, &pick);
        commit(inst, root, now);
    } else if commit(inst, root, now) {
        send(dg, &pick);
    }
}

/// Commits what the partitions changed and, when the root logs packets, sends the notices of
/// every packet the commit made durable; whether it went through. A failed commit keeps its
/// notices for the next one, which covers its batch too.
fn commit(inst: &mut Instance, root: &Root<'_>, now: u64) -> bool {
    if let Err(e) = inst.commit(now) {
        tracing::warn!("commit failed, the batch's packets do not leave the cluster: {e}");
        return false;
    }
    if root.logs {
        let (released, done) = inst.notices();
        root.notify(Kind::Committed, released);
        root.notify(Kind::Done, done);
    }
    inst.clear_notices();
    true
}

/// How often a failed commit is tried again while no packet comes to try it with: the root
/// holds its packets' outputs until it goes through.
const COMMIT_RETRY: Duration = Duration::from_millis(100);

/// How often an instance sends its partitions' watermarks ([`Kind::Through`]) to the root.
const WATERMARK_EVERY: Duration = Duration::from_millis(200);

/// How long the main loop may go without a turn before the heartbeat stops: a loop stuck for
/// longer is failed over.
const STALL_LIMIT: Duration = Duration::from_secs(2);

/// How long the main loop may spend building one claimed partition before the heartbeat
/// stops. Building waits on the store: its ownership record, the partition's first reads and,
/// on a store that creates its schema on first use (Cassandra: a keyspace and tables, each a
/// schema change the whole cluster agrees on, hundreds of milliseconds), longer than
/// [`STALL_LIMIT`]. Another instance would wait as long.
const BUILD_LIMIT: Duration = Duration::from_secs(30);

/// The heartbeat: a thread that sends the main loop's latest report every interval while the
/// loop keeps turning (HashMVT §IV-C). A crashed or stopped process goes silent at once; one
/// whose loop is stuck, after [`STALL_LIMIT`] ([`BUILD_LIMIT`] while it builds a claimed
/// partition).
struct Heartbeat {
    report: Arc<std::sync::Mutex<Option<Report>>>,
    /// When the main loop last turned, ns since `epoch`; `u64::MAX`: stop.
    turned: Arc<AtomicU64>,
    /// When the main loop's commit began, ns since `epoch` plus one; 0: not in a commit. A
    /// commit held longer than an interval adds one to the report's `store_trouble`.
    in_store: Arc<AtomicU64>,
    /// When the main loop began building a claimed partition, ns since `epoch` plus one; 0:
    /// not building. Up to [`BUILD_LIMIT`] is not a stall.
    building: Arc<AtomicU64>,
    epoch: Instant,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    fn start(
        socket: std::net::UdpSocket,
        to: Vec<SocketAddrV4>,
        every: Duration,
        seal: Sealer,
    ) -> Result<Heartbeat, ClusterError> {
        let report = Arc::new(std::sync::Mutex::new(None::<Report>));
        let turned = Arc::new(AtomicU64::new(0));
        let in_store = Arc::new(AtomicU64::new(0));
        let building = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let (r, t, s, b) = (
            Arc::clone(&report),
            Arc::clone(&turned),
            Arc::clone(&in_store),
            Arc::clone(&building),
        );
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                // From the wall clock: a restarted process's reports go on above its old ones.
                let mut seq = wall_ns();
                // Commits held longer than an interval, and the last one counted.
                let (mut held, mut counted) = (0u64, 0u64);
                let mut tick = epoch.elapsed().as_nanos() as u64;
                loop {
                    std::thread::sleep(every);
                    let last = t.load(Ordering::Relaxed);
                    if last == u64::MAX {
                        return;
                    }
                    let now = epoch.elapsed().as_nanos() as u64;
                    let built = b.load(Ordering::Relaxed);
                    let stalled = now - last.min(u64::MAX - 1) > STALL_LIMIT.as_nanos() as u64
                        && (built == 0 || now + 1 - built > BUILD_LIMIT.as_nanos() as u64);
                    // This thread overslept: the whole process was paused (a stopped VM, a
                    // straggler), not held by the store.
                    let paused = now - tick > 2 * every.as_nanos() as u64;
                    tick = now;
                    let began = s.load(Ordering::Relaxed);
                    if !paused
                        && began != 0
                        && began != counted
                        && now + 1 - began > every.as_nanos() as u64
                    {
                        held += 1;
                        counted = began;
                    }
                    let msg = match r.lock() {
                        Ok(g) if !stalled => g.as_ref().map(|rep| {
                            seq += 1;
                            let store_trouble = rep.store_trouble + held;
                            Report {
                                seq,
                                store_trouble,
                                ..rep.clone()
                            }
                            .encode()
                        }),
                        _ => None,
                    };
                    if let Some(m) = msg {
                        // Every controller: the leader acts on it, the others stand by.
                        let d = seal.sealed(m);
                        for to in &to {
                            let _ = socket.send_to(&d, to);
                        }
                    }
                }
            })?;
        Ok(Heartbeat {
            report,
            turned,
            in_store,
            building,
            epoch,
            thread: Some(thread),
        })
    }

    /// The report to send from now on (once per interval).
    fn update(&self, r: Report) {
        if let Ok(mut g) = self.report.lock() {
            *g = Some(r);
        }
        self.alive();
    }

    /// The main loop begins (`true`) or ends a commit.
    fn in_store(&self, now: bool) {
        self.in_store.store(self.mark(now), Ordering::Relaxed);
    }

    /// The main loop begins (`true`) building a claimed partition, or ends the claims.
    fn building(&self, now: bool) {
        self.building.store(self.mark(now), Ordering::Relaxed);
    }

    /// Now as ns since `epoch` plus one if `on`, else 0.
    fn mark(&self, on: bool) -> u64 {
        match on {
            true => self.epoch.elapsed().as_nanos() as u64 + 1,
            false => 0,
        }
    }

    /// The main loop turned.
    fn alive(&self) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.turned.store(now.min(u64::MAX - 1), Ordering::Relaxed);
    }

    fn stop(mut self) {
        self.turned.store(u64::MAX, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
