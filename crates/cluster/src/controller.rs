//! The controller's process: the decision core of [`flowstate_control::cluster`] fed by the
//! instances' reports and an operator's commands, its assignment kept in the store and sent
//! to the root and every instance (StatelessNF §4.2, HashMVT §IV).
//!
//! * Each chain stage has its own decision core, pool of instances and assignment; the pools
//!   share one id space (a core never starts an id another one knows).
//! * A stage's assignment lives in the store under `cluster@Value@assignment.<stage>` and is
//!   written by compare-and-set on the previous one, so a restarted controller resumes it (and
//!   changes nothing while the same instances report), and a second controller cannot
//!   overwrite a newer one unnoticed.
//! * It is sent to the root and to the stage's running instances when it changes and again
//!   every heartbeat (UDP may lose one).
//! * Instances are started and stopped through a [`Launcher`], which the binary provides
//!   (it knows namespaces and command lines).
//! * Operators talk to it over a UNIX socket, one JSON request per connection:
//!   `{"cmd":"status"}`, `{"cmd":"scale","n":3,"stage":0}`, `{"cmd":"drain","id":2}`.
//! * Any number of controllers run (`[cluster] controller` lists their addresses); one leads,
//!   holding the lease of [`crate::lease`], the others stand by. Only the leader decides,
//!   writes and sends assignments. A standby that takes the lease resumes the stored
//!   assignments as a restarted controller does and publishes them again, owners unchanged, in
//!   its term; a leader that loses the lease (or cannot write an assignment) stops at once and
//!   stands by. Each takeover and each loss is logged once with its reason.

use crate::auth::{KeyRing, Opener, Role, Sender};
use crate::config::{ClusterSection, CONTROL_PORT};
use crate::lease::{Change, Leadership, Lease};
use crate::{wall_ns, ClusterError};
use flowstate_control::cluster::{Assignment, Controller, Decision, Lag, MemberState, Report};
use flowstate_router::Stop;
use flowstate_state::{Backend, Kind, ObjectKey, Op, Reply};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::SocketAddrV4;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Starts and stops instance processes.
pub trait Launcher {
    /// Starts instance `id` of stage `stage`; its process id.
    fn start(&mut self, stage: u32, id: u32) -> std::io::Result<u32>;
    /// Stops instance `id` (drained: SIGTERM), if its process is known.
    fn stop(&mut self, id: u32);
    /// Makes sure a failed instance's process is gone (SIGKILL: a hung one must not come
    /// back and act on partitions it lost), where the launcher can.
    fn reap(&mut self, id: u32);
    /// Whether it starts instances at all: a controller whose instances are started by their
    /// hosts (and join) starts none and scales out only as they join.
    fn starts(&self) -> bool {
        true
    }
}

/// The key of stage `stage`'s assignment.
pub fn assignment_key(stage: u32) -> ObjectKey {
    ObjectKey::shared("cluster", Kind::Value, &format!("assignment.{stage}"))
}

/// A command to the controller.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Command {
    /// The instances and the assignment.
    Status,
    /// Run `n` instances in a stage.
    Scale {
        /// Target count.
        n: u32,
        /// The stage (default 0).
        #[serde(default)]
        stage: u32,
    },
    /// Move every partition off instance `id`, then stop it.
    Drain {
        /// The instance.
        id: u32,
    },
}

/// One instance in a status answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InstanceStatus {
    /// Its id.
    pub id: u32,
    /// The stage it runs.
    #[serde(default)]
    pub stage: u32,
    /// Its process (0 before its first report).
    pub pid: u32,
    /// starting, live, draining or dead.
    pub state: String,
    /// Partitions the assignment gives it.
    pub partitions: Vec<u32>,
    /// Its last load η.
    pub load: f64,
    /// Packets it processed.
    pub packets: u64,
    /// Packets it dropped.
    pub drops: u64,
    /// Per-flow table entries (sessions, connections) its partitions hold.
    #[serde(default)]
    pub entries: u64,
    /// Its data address.
    pub addr: Option<String>,
}

/// One stage in a status answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageStatus {
    /// The stage.
    pub stage: u32,
    /// Its assignment's version.
    pub version: u64,
    /// Its traffic partitions.
    pub partitions: u32,
    /// Instances wanted.
    pub target: u32,
}

/// The answer to [`Command::Status`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// The stages, in order.
    pub stages: Vec<StageStatus>,
    /// The instances of every stage, by stage and id.
    pub instances: Vec<InstanceStatus>,
    /// The leading controller, as this one last knew it (none: no lease seen yet).
    #[serde(default)]
    pub leader: Option<LeaderStatus>,
    /// The ids of the controller's keys, the one that signs first.
    #[serde(default)]
    pub keys: Vec<u8>,
    /// Reports and lag reports taken ([`crate::auth`]).
    #[serde(default)]
    pub auth_accepted: u64,
    /// Datagrams refused, by reason ([`crate::auth::Rejected`]).
    #[serde(default)]
    pub auth_rejected: std::collections::BTreeMap<String, u64>,
}

/// The leading controller in a status answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaderStatus {
    /// Its term.
    pub term: u64,
    /// Its index in `[cluster] controller`.
    pub index: u32,
    /// Its address.
    pub address: String,
    /// Whether the answering controller is the leader.
    pub me: bool,
}

impl Status {
    /// Whether every stage runs its target of live instances, every partition has an owner
    /// and an assignment was published.
    pub fn ready(&self) -> bool {
        !self.stages.is_empty()
            && self.stages.iter().all(|st| {
                let of = || self.instances.iter().filter(|i| i.stage == st.stage);
                let live = of().filter(|i| i.state == "live").count() as u32;
                let owned: usize = of().map(|i| i.partitions.len()).sum();
                live >= st.target && owned == st.partitions as usize && st.version > 0
            })
    }
}

/// What the controller's process needs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// The cluster.
    pub section: ClusterSection,
    /// The command socket.
    pub socket: PathBuf,
    /// The keys that sign and check every datagram between roles.
    pub keys: KeyRing,
    /// Where its status goes (every 200 ms): what `cluster status` answers, for a listener
    /// another host reads (`/api/v1/cluster`).
    pub stats: crate::StatsSink,
}

/// Reads stage `stage`'s assignment kept in the store.
fn load(
    store: &mut dyn Backend,
    stage: u32,
) -> Result<Option<(Assignment, Vec<u8>)>, ClusterError> {
    let mut replies = Vec::new();
    store
        .execute(
            &[Op::Get {
                key: assignment_key(stage),
            }],
            &mut replies,
        )
        .map_err(|e| ClusterError::Store(e.to_string()))?;
    match replies.pop() {
        Some(Reply::Value(Some(b))) => match Assignment::decode(&b) {
            Ok(a) => Ok(Some((a, b))),
            Err(e) => Err(ClusterError::Store(format!(
                "the stored assignment of stage {stage} does not decode ({e}); clear `cluster@Value@assignment.{stage}` to start afresh"
            ))),
        },
        Some(Reply::Value(None)) => Ok(None),
        other => Err(ClusterError::Store(format!("reading the assignment: {other:?}"))),
    }
}

/// One stage's decision core and what the store holds of it.
struct Stage {
    ctl: Controller,
    /// The assignment as last written (the compare-and-set's expected value).
    stored: Option<Vec<u8>>,
}

/// Takes over: the stored assignments resumed (a stage without one starts its
/// `[[cluster.stage]]` (or `[cluster]`) `instances` when the launcher starts any), published
/// again in `term` (raised above any term they carry).
fn take_over(
    o: &ControllerOptions,
    store: &mut dyn Backend,
    launcher: &dyn Launcher,
    stages: u32,
    lease: &Leadership,
    term: u64,
    now: u64,
) -> Result<(Vec<Stage>, u64), ClusterError> {
    let s = &o.section;
    let mut cores = Vec::new();
    for k in 0..stages {
        let restored = load(store, k)?;
        let stored = restored.as_ref().map(|(_, b)| b.clone());
        let mut ctl = Controller::new(s.controller(k), restored.map(|(a, _)| a), now);
        if stored.is_none() && launcher.starts() {
            let st = s.stage(k);
            ctl.scale(st.instances, now)
                .map_err(|e| ClusterError::Config(format!("stage {k}: {e}")))?;
        } else {
            tracing::info!(
                stage = k,
                version = ctl.assignment().version,
                "resumed the stored assignment"
            );
        }
        cores.push(Stage { ctl, stored });
    }
    // An assignment of a later term than the lease's (the lease record was lost): lead above it.
    let newest = cores
        .iter()
        .map(|c| c.ctl.assignment().term)
        .max()
        .unwrap_or(0);
    let term = term.max(newest + 1);
    lease.raise(term);
    for (k, core) in (0u32..).zip(cores.iter_mut()) {
        if let Some(a) = core.ctl.lead(term) {
            persist(store, k, &mut core.stored, a.encode())?;
        }
    }
    Ok((cores, term))
}

/// Runs a controller of `stages` chain stages until `stop`: standing by until it holds the
/// leader's lease, then leading while it holds it.
pub fn run_controller(
    o: &ControllerOptions,
    mut store: Box<dyn Backend>,
    lease_store: Box<dyn Backend>,
    launcher: &mut dyn Launcher,
    stages: u32,
    stop: Stop,
) -> Result<(), ClusterError> {
    let s = &o.section;
    let (index, reports) = crate::bind_first_own(&s.controllers_at(), "cluster.controller")?;
    let me = *s.controllers_at()[index as usize].ip();
    let _ = std::fs::remove_file(&o.socket);
    let commands = UnixListener::bind(&o.socket).map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot bind {}: {e}", o.socket.display()))
    })?;
    commands.set_nonblocking(true)?;
    let lease = Leadership::start(Lease::new(index, me, s.lease), lease_store)?;
    // The stages' decision cores while this controller leads; empty while it stands by.
    let mut cores: Vec<Stage> = Vec::new();
    let roots: Vec<SocketAddrV4> = s
        .roots
        .iter()
        .map(|a| SocketAddrV4::new(*a, CONTROL_PORT))
        .collect();
    let mut buf = vec![0u8; 65536];
    let seal = o.keys.sealer(Sender::controller(index), wall_ns())?;
    let mut opener = o.keys.opener(s.clock_skew.as_nanos() as u64);
    let mut next_keys = Instant::now();
    let mut next_stats = Instant::now();
    let mut next_tick = Instant::now();
    let mut next_send = Instant::now();
    tracing::info!(index, address = %me, "controller up, standing by until it holds the lease");
    while !stop.stopped() {
        flowstate_io::afpacket::wait_readable(
            &[std::os::fd::AsRawFd::as_raw_fd(&reports)],
            Duration::from_millis(5),
        )
        .map_err(|e| ClusterError::Io(std::io::Error::other(e.to_string())))?;
        let now = wall_ns();
        let change = match lease.change() {
            // Leading with no stages: this loop stood by when the lease ran out, and the
            // lease's thread, held in a store call meanwhile, renewed it in the same term
            // (nobody took it over): lead again.
            None | Some(Change::None) if cores.is_empty() => {
                lease.leading().map(|term| Change::Elected {
                    term,
                    from: lease.holder(),
                })
            }
            other => other,
        };
        match change {
            None | Some(Change::None) => {}
            Some(Change::Elected { term, from }) => {
                match take_over(o, store.as_mut(), launcher, stages, &lease, term, now) {
                    Ok((c, term)) => {
                        match from {
                            // Its own lease, renewed after it ran out: the same term.
                            Some(h) if h.index == index && h.term == term => tracing::warn!(
                                term,
                                "leading again: the store answered before any other controller \
                                 took the lease"
                            ),
                            Some(h) => tracing::warn!(
                                term,
                                previous = %h.addr,
                                previous_term = h.term,
                                "leading: took the lease the previous leader stopped renewing"
                            ),
                            None => tracing::info!(term, "leading: no controller held the lease"),
                        }
                        cores = c;
                        next_send = Instant::now();
                    }
                    Err(e) => {
                        tracing::error!(
                            "standing by: took the lease but cannot resume the assignment: {e}"
                        );
                        lease.resign();
                    }
                }
            }
            Some(Change::Deposed { reason }) => {
                tracing::warn!("standing by: {reason}");
                cores.clear();
            }
        }
        loop {
            match reports.recv_from(&mut buf) {
                Ok((n, _)) => {
                    let Ok((from, msg)) = opener.open(&mut buf[..n], now) else {
                        continue;
                    };
                    match (from.role, Report::decode(msg), Lag::decode(msg)) {
                        // An instance reports for itself only.
                        (Role::Instance, Ok(r), _) if r.id == from.id => {
                            let leading = !cores.is_empty();
                            match cores.get_mut(r.stage as usize) {
                                Some(c) => c.ctl.on_report(&r, now),
                                None if leading => {
                                    tracing::debug!(stage = r.stage, "a report of no stage of ours")
                                }
                                None => {}
                            }
                        }
                        // The root's measure of how long packets wait at each instance.
                        (Role::Root, _, Ok(l)) => {
                            if let Some(c) = cores.get_mut(l.stage as usize) {
                                c.ctl.on_lag(from.id, &l, now);
                            }
                        }
                        (_, Err(e), Err(_)) => {
                            tracing::debug!("neither a report nor a lag report: {e}")
                        }
                        _ => opener.refuse(),
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        let leader = leader_status(&lease, index);
        serve_commands(
            &commands,
            &mut cores,
            &opener,
            &leader,
            launcher.starts(),
            now,
        );
        if Instant::now() >= next_keys {
            next_keys = Instant::now() + crate::root::KEY_CHECK;
            o.keys.reload_if_changed();
            crate::still_here(me, &[])?;
        }
        if Instant::now() >= next_stats {
            next_stats = Instant::now() + Duration::from_millis(200);
            o.stats.publish(&status(&cores, &opener, &leader, now));
        }
        // Acts only within its lease.
        if lease.leading().is_none() {
            if !cores.is_empty() {
                tracing::warn!("standing by: the lease ran out");
                cores.clear();
            }
            continue;
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + Duration::from_millis(10);
            if let Err(e) = tick(&mut cores, store.as_mut(), launcher, now, &mut next_send) {
                tracing::warn!("standing by: {e}");
                cores.clear();
                lease.resign();
                continue;
            }
        }
        if Instant::now() >= next_send {
            next_send = Instant::now() + s.heartbeat;
            for core in &cores {
                let a = core.ctl.assignment();
                if a.version > 0 {
                    // One signed datagram for every receiver (each keeps its own window).
                    let d = seal.sealed(a.encode());
                    for root in &roots {
                        let _ = reports.send_to(&d, root);
                    }
                    for m in a.members.iter().filter(|m| m.live) {
                        let to = SocketAddrV4::new(*m.addr.ip(), CONTROL_PORT);
                        let _ = reports.send_to(&d, to);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_file(&o.socket);
    Ok(())
}

fn leader_status(lease: &Leadership, index: u32) -> Option<LeaderStatus> {
    lease.holder().map(|h| LeaderStatus {
        term: h.term,
        index: h.index,
        address: h.addr.to_string(),
        me: h.index == index && lease.leading().is_some(),
    })
}

/// One decision round of every stage: assignments persisted, instances started and stopped.
/// An error (an assignment that cannot be written) ends this controller's leadership.
fn tick(
    cores: &mut [Stage],
    store: &mut dyn Backend,
    launcher: &mut dyn Launcher,
    now: u64,
    next_send: &mut Instant,
) -> Result<(), ClusterError> {
    for k in 0..cores.len() {
        // The ids the other stages know are not this stage's to start.
        let taken: Vec<u32> = (0..cores.len())
            .filter(|&j| j != k)
            .flat_map(|j| cores[j].ctl.ids())
            .collect();
        let core = &mut cores[k];
        core.ctl.set_taken(taken);
        let stage = k as u32;
        for d in core.ctl.tick(now) {
            match d {
                Decision::Publish(a) => {
                    persist(store, stage, &mut core.stored, a.encode())?;
                    tracing::info!(stage, version = a.version, "assignment published");
                    *next_send = Instant::now();
                }
                Decision::Start { id } => match launcher.start(stage, id) {
                    Ok(pid) => tracing::info!(stage, id, pid, "instance started"),
                    Err(e) => tracing::error!(stage, id, "cannot start instance: {e}"),
                },
                Decision::Stop { id } => {
                    tracing::info!(stage, id, "instance drained: stopping it");
                    launcher.stop(id);
                }
                Decision::Failed { id } => {
                    tracing::warn!(
                        stage,
                        id,
                        "instance failed: its partitions go to the others"
                    );
                    launcher.reap(id);
                }
                Decision::Straggler { id, lag_ns } => {
                    tracing::warn!(
                        stage,
                        id,
                        lag_ms = lag_ns as f64 / 1e6,
                        "instance is a straggler (its packets wait too long): failed over, its \
                         unfinished packets replayed to the others"
                    );
                    launcher.reap(id);
                }
            }
        }
    }
    Ok(())
}

/// Writes stage `stage`'s new assignment by compare-and-set on the one this controller last
/// saw.
fn persist(
    store: &mut dyn Backend,
    stage: u32,
    stored: &mut Option<Vec<u8>>,
    bytes: Vec<u8>,
) -> Result<(), ClusterError> {
    let mut replies = Vec::new();
    let op = Op::CompareAndSet {
        key: assignment_key(stage),
        expected: stored.clone(),
        new: Some(bytes.clone()),
    };
    // A store that is briefly away: retry for a while (the data path goes on meanwhile).
    let mut last = String::new();
    for attempt in 0..50 {
        replies.clear();
        match store.execute(std::slice::from_ref(&op), &mut replies) {
            Ok(()) => match replies.pop() {
                Some(Reply::Bool(true)) => {
                    *stored = Some(bytes);
                    return Ok(());
                }
                Some(Reply::Bool(false)) => {
                    return Err(ClusterError::Store(
                        "the stored assignment changed under this controller: is another controller running?".into(),
                    ))
                }
                other => last = format!("{other:?}"),
            },
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20 * (attempt + 1)));
    }
    Err(ClusterError::Store(format!(
        "cannot write the assignment: {last}"
    )))
}

fn status(cores: &[Stage], opener: &Opener, leader: &Option<LeaderStatus>, now: u64) -> Status {
    let mut out = Status {
        leader: leader.clone(),
        stages: Vec::new(),
        instances: Vec::new(),
        keys: opener.keys(),
        auth_accepted: opener.accepted(),
        auth_rejected: opener
            .rejected()
            .by_name()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    };
    for (stage, core) in (0u32..).zip(cores) {
        let ctl = &core.ctl;
        let a = ctl.assignment();
        out.stages.push(StageStatus {
            stage,
            version: a.version,
            partitions: a.slots.len() as u32,
            target: ctl.target(),
        });
        out.instances.extend(ctl.status(now).into_iter().map(|m| {
            InstanceStatus {
                id: m.id,
                stage,
                pid: m.pid,
                state: match m.state {
                    MemberState::Starting => "starting",
                    MemberState::Live => "live",
                    MemberState::Standby => "standby",
                    MemberState::Draining => "draining",
                    MemberState::Dead => "dead",
                }
                .into(),
                partitions: a.owned_by(m.id),
                load: m.load,
                packets: m.packets,
                drops: m.drops,
                entries: m.entries,
                addr: m.addr.map(|a| a.to_string()),
            }
        }));
    }
    out
}

fn serve_commands(
    listener: &UnixListener,
    cores: &mut [Stage],
    opener: &Opener,
    leader: &Option<LeaderStatus>,
    starts: bool,
    now: u64,
) {
    for _ in 0..16 {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut line = String::new();
        let mut reader = BufReader::new(&stream);
        let stages = cores.len();
        let answer = match reader.read_line(&mut line) {
            Ok(_) => match serde_json::from_str::<Command>(line.trim()) {
                Ok(Command::Status) => serde_json::to_value(status(cores, opener, leader, now))
                    .map_err(|e| e.to_string()),
                Ok(_) if cores.is_empty() => Err(match leader {
                    Some(l) => format!(
                        "this controller stands by: the leader is controller {} at {} (term {})",
                        l.index, l.address, l.term
                    ),
                    None => "this controller stands by and knows no leader yet".into(),
                }),
                Ok(Command::Scale { n, stage }) => match cores.get_mut(stage as usize) {
                    Some(c) if !starts && n > c.ctl.target() => Err(format!(
                        "stage {stage}: this controller starts no instance (no [cluster] \
                         start_command): start instances on their hosts, they join"
                    )),
                    Some(c) => c
                        .ctl
                        .scale(n, now)
                        .map(|()| serde_json::json!({"ok": true, "stage": stage, "target": n}))
                        .map_err(|e| format!("stage {stage}: {e}")),
                    None => Err(format!(
                        "no stage {stage}: the chain has {stages} (0 to {})",
                        stages - 1
                    )),
                },
                Ok(Command::Drain { id }) => {
                    match cores.iter_mut().find(|c| c.ctl.ids().any(|i| i == id)) {
                        Some(c) => c
                            .ctl
                            .drain(id, now)
                            .map(|()| serde_json::json!({"ok": true, "draining": id}))
                            .map_err(|e| e.to_string()),
                        None => Err(format!("instance {id} is unknown")),
                    }
                }
                Err(e) => Err(format!("bad request: {e}")),
            },
            Err(e) => Err(format!("cannot read the request: {e}")),
        };
        let v = answer.unwrap_or_else(|e| serde_json::json!({"error": e}));
        let mut w = &stream;
        let _ = writeln!(w, "{v}");
    }
}

/// Sends `cmd` to the controller listening on `socket`; its JSON answer, or the error it
/// gave.
pub fn request(socket: &std::path::Path, cmd: &Command) -> Result<serde_json::Value, ClusterError> {
    let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| {
        ClusterError::Io(std::io::Error::new(
            e.kind(),
            format!(
                "no controller at {} ({e}): is the cluster up (`flowstate cluster up CONFIG`)?",
                socket.display()
            ),
        ))
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut w = &stream;
    writeln!(
        w,
        "{}",
        serde_json::to_string(cmd).map_err(std::io::Error::other)?
    )?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| ClusterError::Io(std::io::Error::other(format!("bad answer: {e}"))))?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(e) => Err(ClusterError::Config(e.to_string())),
        None => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_json_lines() {
        assert_eq!(
            serde_json::to_string(&Command::Status).unwrap(),
            r#"{"cmd":"status"}"#
        );
        assert_eq!(
            serde_json::from_str::<Command>(r#"{"cmd":"scale","n":3}"#).unwrap(),
            Command::Scale { n: 3, stage: 0 }
        );
        assert_eq!(
            serde_json::from_str::<Command>(r#"{"cmd":"scale","n":3,"stage":1}"#).unwrap(),
            Command::Scale { n: 3, stage: 1 }
        );
        assert!(serde_json::from_str::<Command>(r#"{"cmd":"explode"}"#).is_err());
    }

    #[test]
    fn the_assignment_is_kept_by_compare_and_set() {
        use flowstate_state::local::LocalStore;
        use flowstate_state::Connector;
        let store = LocalStore::new();
        let mut b = store.connect().unwrap();
        assert!(load(b.as_mut(), 1).unwrap().is_none());
        let a = Assignment::empty(1, 4);
        let mut stored = None;
        persist(b.as_mut(), 1, &mut stored, a.encode()).unwrap();
        assert_eq!(load(b.as_mut(), 1).unwrap().unwrap().0, a);
        // Each stage has its own.
        assert!(load(b.as_mut(), 0).unwrap().is_none());
        // Someone else wrote in between: refused, not overwritten.
        let mut stale = None;
        let e = persist(b.as_mut(), 1, &mut stale, a.encode()).unwrap_err();
        assert!(e.to_string().contains("another controller"), "{e}");
    }
}
