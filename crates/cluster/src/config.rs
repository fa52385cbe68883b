//! `[cluster]`: a deployment of a root, a controller and instances, in the same file as the
//! chain (`[input]`/`[output]` are the root's two ports, `[state]` the shared store,
//! `[[chain]]` what every instance runs).
//!
//! ```toml
//! [cluster]
//! partitions = 16          # traffic partitions, 1 to 4096 (a NAT's port range is split among them)
//! instances = 2            # instances `cluster up` starts
//! min_instances = 1        # bounds of `cluster scale` and of scaling on load
//! max_instances = 16
//! standby = 0              # warm standby instances beyond these, owning nothing: a failed
//!                          # instance's partitions go to one at once, then another starts
//! address = "192.0.2.1"    # the root's address on the cluster network, or a list of them:
//!                          # several roots at once (CHC §4.1), the upstream spreads flows
//!                          # over them (ECMP); each runs where its address is
//! controller = "192.0.2.1" # the controller's address (default: the root's), or a list of
//!                          # them: one leads (a lease in the store), the others stand by
//! lease = "1s"             # the leader's lease: a standby takes over this long after the
//!                          # leader last renewed it
//! heartbeat = "50ms"       # instances report this often
//! missed = 3               # reports missed before an instance is declared dead
//! move_timeout = "500ms"   # how long the root waits for an old owner to release
//! hold = 4096              # packets held per moving partition
//! log_packets = 65536      # the root's packet log: in-flight packets kept for replay after a
//!                          # failure (CHC §5.4); 0 turns replay and duplicate suppression off
//! straggler = "250ms"      # an instance whose packets wait this long at it (in `missed` root
//!                          # reports in a row, while another keeps up) is failed over; "0s": never
//! auto_scale = false       # scale out/in on load thresholds (mean η of the instances)
//! scale_out_load = 0.8
//! scale_in_load = 0.2
//! store = "managed"        # `cluster up` starts the store at `address` (backend store or redis);
//!                          # "external": `[state] url` names a running one
//! key_file = "/etc/flowstate/cluster.key"   # the keys every datagram between the roles is
//!                          # signed and checked with (`flowstate cluster key new FILE`; mode
//!                          # 0600); relative to this file's directory. Left out, `cluster up`
//!                          # uses the lab's own key.
//! start_command = "systemctl start flowstate-instance@{id}"  # how the controller scales out
//!                          # where nobody else starts instances ({id}, {stage} replaced; run
//!                          # by `sh -c`); left out, instances are started by their hosts and
//!                          # join, and `flowstate controller` starts none
//! stop_command = "systemctl stop flowstate-instance@{id}"     # a drained instance's end
//! clock_skew = "60s"       # how far ahead of a receiver's clock a sender's numbering may be
//! unauthenticated = false  # true: trailers carry no tag (measuring the cost in a lab only)
//! unfenced_store = false   # true: run on a store that cannot fence commits (cassandra),
//!                          # where a cut-off instance can still write a partition that moved
//! moves = "claim"          # a move hands ownership over, the state stays in the store;
//!                          # "copy": the whole partition's state is copied too (OpenNF-style
//!                          # baseline, CHC §7.3 R2)
//!
//! [[cluster.stage]]        # optional, one per chain stage in order (`[[chain]] stage = k`):
//! partitions = 8           # that stage's own partitioning and pool of instances; a key
//! instances = 1            # left out takes the value above
//! min_instances = 1
//! max_instances = 4
//! standby = 1
//! ```
//!
//! Every key is optional; an unknown key or a bad value is an error naming `cluster.KEY`
//! (`cluster.stage[k].KEY` in a stage's table).
//!
//! **Stages** (CHC §4.1): a chain may be cut into stages, each run by its own pool of
//! instances and partitioned by its own NFs' scopes. The instances of all stages share one id
//! space (their lab namespaces); the root steers a packet to stage 0's owner, each stage's
//! output to the next stage's owner, and the last stage's out of its port.

use std::net::Ipv4Addr;
use std::time::Duration;

/// UDP port of the controller (instances' reports).
pub(crate) const CONTROLLER_PORT: u16 = 7900;
/// UDP port where the root and every instance take the controller's assignment.
pub(crate) const CONTROL_PORT: u16 = 7901;
/// Most partitions.
pub(crate) const MAX_PARTITIONS: u32 = 4096;
/// How far ahead of the last one seen an assignment version or a partition's epoch may be:
/// each publish adds one to the version, each owner change one to an epoch, so a real one
/// is never this far ahead; a value beyond is refused, not adopted.
pub(crate) const MAX_STEP: u64 = 1 << 20;

/// Whether `next` is within [`MAX_STEP`] of `last`.
pub(crate) fn within_step(last: u64, next: u64) -> bool {
    next <= last.saturating_add(MAX_STEP)
}

/// What a receiver that applied the assignment (`term`, `version`) does with `a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fresh {
    /// Apply it.
    Newer,
    /// Ignore it: not newer, or of a term a newer leader ended.
    Old,
    /// Refuse it: its version or term is further ahead than any real one can be.
    FarAhead,
}

/// Whether `a` is newer than the assignment (`term`, `version`) applied (version 0: none).
pub(crate) fn freshness(
    term: u64,
    version: u64,
    a: &flowstate_control::cluster::Assignment,
) -> Fresh {
    if a.term < term || (version != 0 && a.version <= version) {
        Fresh::Old
    } else if version != 0 && !(within_step(version, a.version) && within_step(term, a.term)) {
        Fresh::FarAhead
    } else {
        Fresh::Newer
    }
}

/// An address or a non-empty list of distinct ones.
fn addresses(v: &toml::Value) -> Option<Vec<Ipv4Addr>> {
    let list = match v {
        toml::Value::Array(a) => a.iter().collect(),
        one => vec![one],
    };
    let l = list
        .iter()
        .map(|a| a.as_str().and_then(|s| s.parse().ok()))
        .collect::<Option<Vec<Ipv4Addr>>>()?;
    let distinct = l.iter().collect::<std::collections::BTreeSet<_>>().len() == l.len();
    (!l.is_empty() && distinct).then_some(l)
}

/// Whether `cluster up` starts the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// Started by `cluster up` at the cluster address, stopped by `cluster down`.
    Managed,
    /// Already running where `[state] url` says.
    External,
}

/// One stage's partitioning and pool of instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageSection {
    /// Traffic partitions.
    pub partitions: u32,
    /// Instances `cluster up` starts.
    pub instances: u32,
    /// Fewest instances.
    pub min_instances: u32,
    /// Most instances.
    pub max_instances: u32,
    /// Warm standby instances beyond the pool, owning nothing.
    pub standby: u32,
}

/// `[cluster]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSection {
    /// Traffic partitions (of every stage without its own).
    pub partitions: u32,
    /// Instances `cluster up` starts (per stage, unless a stage says otherwise).
    pub instances: u32,
    /// Fewest instances (per stage).
    pub min_instances: u32,
    /// Most instances (per stage).
    pub max_instances: u32,
    /// Warm standby instances (per stage): running, owning nothing, taking a failed
    /// instance's partitions at once.
    pub standby: u32,
    /// `[[cluster.stage]]`: the stages that have tables of their own, in stage order.
    pub stages: Vec<StageSection>,
    /// The roots' addresses (at least one): several take traffic at once, each in its own
    /// clock space ([`crate::take_epoch`]).
    pub roots: Vec<Ipv4Addr>,
    /// The controllers' addresses (empty: one, at the root's): one leads, the others stand by.
    pub controllers: Vec<Ipv4Addr>,
    /// How long the leading controller's lease lasts without a renewal.
    pub lease: Duration,
    /// Report interval.
    pub heartbeat: Duration,
    /// Reports missed before an instance is dead.
    pub missed: u32,
    /// How long the root waits for a release.
    pub move_timeout: Duration,
    /// Packets held per moving partition.
    pub hold: usize,
    /// Packets the root's log keeps for replay ([`crate::log`]); 0: no log.
    pub log_packets: usize,
    /// How long an instance's packets may wait at it before the controller fails it over as
    /// a straggler (CHC §5.3); zero: never.
    pub straggler: Duration,
    /// Scale on load.
    pub auto_scale: bool,
    /// Mean load above which to scale out.
    pub scale_out_load: f64,
    /// Mean load below which to scale in.
    pub scale_in_load: f64,
    /// Whether `cluster up` starts the store.
    pub store: StoreMode,
    /// Copy a partition's whole state on a move (`moves = "copy"`).
    pub copy_on_move: bool,
    /// The key file, as written (relative to the deployment file's directory).
    pub key_file: Option<std::path::PathBuf>,
    /// How far ahead of a receiver's clock a sender's datagram numbers may be
    /// ([`crate::auth`]).
    pub clock_skew: Duration,
    /// Datagrams carry no tag: nothing is authenticated (a lab measuring the cost).
    pub unauthenticated: bool,
    /// Instances run on a store that cannot fence their commits (cassandra), knowing that one
    /// cut off from the others can still write a partition that moved.
    pub unfenced_store: bool,
    /// The command that starts instance `{id}` of stage `{stage}` (`flowstate controller`).
    pub start_command: Option<String>,
    /// The command that stops a drained instance `{id}`.
    pub stop_command: Option<String>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            partitions: 16,
            instances: 2,
            min_instances: 1,
            max_instances: 16,
            standby: 0,
            roots: vec![Ipv4Addr::new(192, 0, 2, 1)],
            controllers: Vec::new(),
            lease: Duration::from_secs(1),
            heartbeat: Duration::from_millis(50),
            missed: 3,
            move_timeout: Duration::from_millis(500),
            hold: 4096,
            log_packets: 65536,
            straggler: Duration::from_millis(250),
            auto_scale: false,
            scale_out_load: 0.8,
            scale_in_load: 0.2,
            store: StoreMode::Managed,
            copy_on_move: false,
            key_file: None,
            clock_skew: Duration::from_secs(60),
            unauthenticated: false,
            unfenced_store: false,
            start_command: None,
            stop_command: None,
            stages: Vec::new(),
        }
    }
}

impl ClusterSection {
    /// Reads `[cluster]`; every error is reported, as `(key, reason)` with the key as
    /// `cluster.KEY` (`cluster.stage[k].KEY` in a stage's table).
    pub fn from_table(t: &toml::Table) -> Result<ClusterSection, Vec<(String, String)>> {
        let mut c = ClusterSection::default();
        let mut errors: Vec<(String, String)> = Vec::new();
        let err = |k: &str, r: String| (format!("cluster.{k}"), r);
        let int = |k: &str, v: &toml::Value, lo: i64, hi: i64| -> Result<i64, (String, String)> {
            match v.as_integer() {
                Some(n) if (lo..=hi).contains(&n) => Ok(n),
                _ => Err(err(
                    k,
                    format!("expected an integer from {lo} to {hi}, got {v}"),
                )),
            }
        };
        let dur = |k: &str, v: &toml::Value| -> Result<Duration, (String, String)> {
            match flowstate_config::duration_value(v) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(err(k, "must be more than zero".into())),
                Err(r) => Err(err(k, r)),
            }
        };
        let load = |k: &str, v: &toml::Value| -> Result<f64, (String, String)> {
            match v.as_float().or_else(|| v.as_integer().map(|i| i as f64)) {
                Some(x) if (0.0..=1.0).contains(&x) => Ok(x),
                _ => Err(err(k, format!("expected a load from 0 to 1, got {v}"))),
            }
        };
        let mut stage_tables = None;
        for (k, v) in t {
            let done: Result<(), (String, String)> = match k.as_str() {
                "stage" => {
                    stage_tables = Some(v);
                    Ok(())
                }
                "partitions" => int(k, v, 1, i64::from(MAX_PARTITIONS)).map(|n| c.partitions = n as u32),
                "instances" => int(k, v, 1, 1024).map(|n| c.instances = n as u32),
                "min_instances" => int(k, v, 1, 1024).map(|n| c.min_instances = n as u32),
                "max_instances" => int(k, v, 1, 1024).map(|n| c.max_instances = n as u32),
                "standby" => int(k, v, 0, 1024).map(|n| c.standby = n as u32),
                "address" => addresses(v).map(|l| c.roots = l).ok_or_else(|| {
                    err(k, format!("expected an IPv4 address like \"192.0.2.1\" or a list of distinct ones, got {v}"))
                }),
                "controller" => addresses(v).map(|l| c.controllers = l).ok_or_else(|| {
                    err(k, format!("expected an IPv4 address like \"192.0.2.2\" or a list of distinct ones, got {v}"))
                }),
                "lease" => dur(k, v).map(|d| c.lease = d),
                "heartbeat" => dur(k, v).map(|d| c.heartbeat = d),
                "missed" => int(k, v, 1, 1000).map(|n| c.missed = n as u32),
                "move_timeout" => dur(k, v).map(|d| c.move_timeout = d),
                "hold" => int(k, v, 1, 1 << 20).map(|n| c.hold = n as usize),
                "log_packets" => int(k, v, 0, 1 << 24).map(|n| c.log_packets = n as usize),
                "straggler" => flowstate_config::duration_value(v)
                    .map(|d| c.straggler = d)
                    .map_err(|r| err(k, format!("{r} (\"0s\": never)"))),
                "auto_scale" => v
                    .as_bool()
                    .map(|b| c.auto_scale = b)
                    .ok_or_else(|| err(k, format!("expected true or false, got {v}"))),
                "key_file" => match v.as_str() {
                    Some(p) if !p.is_empty() => {
                        c.key_file = Some(p.into());
                        Ok(())
                    }
                    _ => Err(err(k, format!("expected a file name, got {v}"))),
                },
                "clock_skew" => dur(k, v).map(|d| c.clock_skew = d),
                "start_command" | "stop_command" => match v.as_str() {
                    Some(cmd) if cmd.contains("{id}") => {
                        let cmd = Some(cmd.to_string());
                        if k == "start_command" {
                            c.start_command = cmd;
                        } else {
                            c.stop_command = cmd;
                        }
                        Ok(())
                    }
                    _ => Err(err(
                        k,
                        format!("expected a command naming the instance as {{id}}, got {v}"),
                    )),
                },
                "unauthenticated" => v
                    .as_bool()
                    .map(|b| c.unauthenticated = b)
                    .ok_or_else(|| err(k, format!("expected true or false, got {v}"))),
                "unfenced_store" => v
                    .as_bool()
                    .map(|b| c.unfenced_store = b)
                    .ok_or_else(|| err(k, format!("expected true or false, got {v}"))),
                "scale_out_load" => load(k, v).map(|x| c.scale_out_load = x),
                "scale_in_load" => load(k, v).map(|x| c.scale_in_load = x),
                "store" => match v.as_str() {
                    Some("managed") => {
                        c.store = StoreMode::Managed;
                        Ok(())
                    }
                    Some("external") => {
                        c.store = StoreMode::External;
                        Ok(())
                    }
                    _ => Err(err(k, format!("expected \"managed\" or \"external\", got {v}"))),
                },
                "moves" => match v.as_str() {
                    Some("claim") => {
                        c.copy_on_move = false;
                        Ok(())
                    }
                    Some("copy") => {
                        c.copy_on_move = true;
                        Ok(())
                    }
                    _ => Err(err(k, format!("expected \"claim\" or \"copy\", got {v}"))),
                },
                _ => Err(err(
                    k,
                    "unknown key; expected partitions, instances, min_instances, max_instances, standby, address, controller, lease, heartbeat, missed, move_timeout, hold, log_packets, straggler, auto_scale, scale_out_load, scale_in_load, store, moves, key_file, clock_skew, unauthenticated, unfenced_store, start_command, stop_command or stage".into(),
                )),
            };
            if let Err(e) = done {
                errors.push(e);
            }
        }
        let defaults = StageSection {
            partitions: c.partitions,
            instances: c.instances,
            min_instances: c.min_instances,
            max_instances: c.max_instances,
            standby: c.standby,
        };
        if let Err((k, r)) = check_pool(&defaults) {
            errors.push(err(k, r));
        }
        match stage_tables.map(|v| (v, v.as_array())) {
            None => {}
            Some((v, None)) => errors.push(err(
                "stage",
                format!("expected [[cluster.stage]] tables, got {v}"),
            )),
            Some((_, Some(tables))) => {
                for (i, t) in tables.iter().enumerate() {
                    match stage(i, t, defaults) {
                        Ok(st) => c.stages.push(st),
                        Err(e) => errors.extend(e),
                    }
                }
            }
        }
        if c.scale_in_load >= c.scale_out_load {
            errors.push(err(
                "scale_in_load",
                format!(
                    "{} must be below scale_out_load {}",
                    c.scale_in_load, c.scale_out_load
                ),
            ));
        }
        if c.unauthenticated && c.key_file.is_some() {
            errors.push(err(
                "unauthenticated",
                "true, but key_file is set: leave one of them out".into(),
            ));
        }
        if errors.is_empty() {
            Ok(c)
        } else {
            Err(errors)
        }
    }

    /// The first root's address (the managed store's and, by default, the controller's).
    pub fn address(&self) -> Ipv4Addr {
        self.roots[0]
    }

    /// Where the controllers take reports: `controller`, else the first root's `address`.
    pub fn controllers_at(&self) -> Vec<std::net::SocketAddrV4> {
        let one = [self.address()];
        let list = match self.controllers.is_empty() {
            true => &one[..],
            false => &self.controllers,
        };
        list.iter()
            .map(|a| std::net::SocketAddrV4::new(*a, CONTROLLER_PORT))
            .collect()
    }

    /// The key file's path: `key_file` as written, relative to `base` (the deployment file's
    /// directory) unless absolute.
    pub fn key_path(&self, base: &std::path::Path) -> Option<std::path::PathBuf> {
        self.key_file.as_ref().map(|p| base.join(p))
    }

    /// Stage `k`'s partitioning and pool: its `[[cluster.stage]]` table, else the values of
    /// `[cluster]`.
    pub fn stage(&self, k: u32) -> StageSection {
        self.stages
            .get(k as usize)
            .copied()
            .unwrap_or(StageSection {
                partitions: self.partitions,
                instances: self.instances,
                min_instances: self.min_instances,
                max_instances: self.max_instances,
                standby: self.standby,
            })
    }

    /// The settings of stage `stage`'s controller core.
    pub fn controller(&self, stage: u32) -> flowstate_control::cluster::ClusterConfig {
        let st = self.stage(stage);
        flowstate_control::cluster::ClusterConfig {
            stage,
            partitions: st.partitions,
            interval: self.heartbeat.as_nanos() as u64,
            missed: self.missed,
            min_instances: st.min_instances,
            max_instances: st.max_instances,
            standby: st.standby,
            auto_scale: self.auto_scale,
            scale_out_load: self.scale_out_load,
            scale_in_load: self.scale_in_load,
            straggler: self.straggler.as_nanos() as u64,
            clock_skew: self.clock_skew.as_nanos() as u64,
            ..flowstate_control::cluster::ClusterConfig::default()
        }
    }
}

/// `[[cluster.stage]]` number `i`, over the values of `[cluster]`; every error.
fn stage(
    i: usize,
    t: &toml::Value,
    defaults: StageSection,
) -> Result<StageSection, Vec<(String, String)>> {
    let key = |k: &str| format!("cluster.stage[{i}].{k}");
    let Some(t) = t.as_table() else {
        return Err(vec![(
            format!("cluster.stage[{i}]"),
            format!("expected a table, got {t}"),
        )]);
    };
    let mut st = defaults;
    let mut errors = Vec::new();
    for (k, v) in t {
        let (lo, hi) = match k.as_str() {
            "partitions" => (1, i64::from(MAX_PARTITIONS)),
            "instances" | "min_instances" | "max_instances" => (1, 1024),
            "standby" => (0, 1024),
            _ => {
                errors.push((
                    key(k),
                    "unknown key; expected partitions, instances, min_instances, max_instances or standby"
                        .into(),
                ));
                continue;
            }
        };
        let n = match v.as_integer() {
            Some(n) if (lo..=hi).contains(&n) => n as u32,
            _ => {
                errors.push((
                    key(k),
                    format!("expected an integer from {lo} to {hi}, got {v}"),
                ));
                continue;
            }
        };
        match k.as_str() {
            "partitions" => st.partitions = n,
            "instances" => st.instances = n,
            "min_instances" => st.min_instances = n,
            "standby" => st.standby = n,
            _ => st.max_instances = n,
        }
    }
    if errors.is_empty() {
        if let Err((k, r)) = check_pool(&st) {
            errors.push((key(k), r));
        }
    }
    if errors.is_empty() {
        Ok(st)
    } else {
        Err(errors)
    }
}

/// A pool's bounds hold together; errors are `(key, reason)`.
fn check_pool(st: &StageSection) -> Result<(), (&'static str, String)> {
    if st.min_instances > st.max_instances {
        return Err((
            "min_instances",
            format!(
                "{} is above max_instances {}",
                st.min_instances, st.max_instances
            ),
        ));
    }
    if !(st.min_instances..=st.max_instances).contains(&st.instances) {
        return Err((
            "instances",
            format!(
                "{} is outside min_instances..=max_instances ({}..={})",
                st.instances, st.min_instances, st.max_instances
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterSection, (String, String)> {
        ClusterSection::from_table(&toml::from_str(text).unwrap()).map_err(|e| e[0].clone())
    }

    #[test]
    fn defaults_and_keys() {
        assert_eq!(parse("").unwrap(), ClusterSection::default());
        let c = parse("partitions = 64\ninstances = 3\nheartbeat = \"20ms\"\nstore = \"external\"\nscale_out_load = 0.9")
            .unwrap();
        assert_eq!((c.partitions, c.instances), (64, 3));
        assert_eq!(c.heartbeat, Duration::from_millis(20));
        assert_eq!(c.store, StoreMode::External);
        assert_eq!(c.controller(0).interval, 20_000_000);
        assert!(parse("moves = \"copy\"").unwrap().copy_on_move);
        let c = parse("key_file = \"keys/cluster.key\"\nclock_skew = \"5s\"").unwrap();
        let base = std::path::Path::new("/etc/flowstate");
        assert_eq!(
            c.key_path(base).unwrap(),
            std::path::Path::new("/etc/flowstate/keys/cluster.key")
        );
        assert_eq!(c.clock_skew, Duration::from_secs(5));
        let abs = parse("key_file = \"/k\"").unwrap();
        assert_eq!(abs.key_path(base).unwrap(), std::path::Path::new("/k"));
    }

    #[test]
    fn one_controller_or_several() {
        let at = |c: &ClusterSection| -> Vec<String> {
            c.controllers_at().iter().map(|a| a.to_string()).collect()
        };
        let one = parse("address = \"192.0.2.9\"").unwrap();
        assert_eq!(at(&one), ["192.0.2.9:7900"]);
        assert_eq!(one.roots, [Ipv4Addr::new(192, 0, 2, 9)]);
        let roots = parse("address = [\"192.0.2.1\", \"192.0.2.2\"]").unwrap();
        assert_eq!(roots.roots.len(), 2);
        assert_eq!(
            at(&roots),
            ["192.0.2.1:7900"],
            "the first root's host by default"
        );
        let named = parse("controller = \"192.0.2.2\"").unwrap();
        assert_eq!(at(&named), ["192.0.2.2:7900"]);
        let two = parse("controller = [\"192.0.2.2\", \"192.0.2.3\"]\nlease = \"2s\"").unwrap();
        assert_eq!(at(&two), ["192.0.2.2:7900", "192.0.2.3:7900"]);
        assert_eq!(two.lease, Duration::from_secs(2));
    }

    #[test]
    fn stages_take_their_own_tables_or_the_defaults() {
        let c = parse("partitions = 32\ninstances = 2\n[[stage]]\n[[stage]]\npartitions = 8\ninstances = 1\nmax_instances = 3\n")
            .unwrap();
        assert_eq!(c.stage(0), c.stage(5));
        assert_eq!((c.stage(0).partitions, c.stage(0).instances), (32, 2));
        let s1 = c.stage(1);
        assert_eq!((s1.partitions, s1.instances, s1.max_instances), (8, 1, 3));
        let ctl = c.controller(1);
        assert_eq!((ctl.stage, ctl.partitions, ctl.max_instances), (1, 8, 3));
        for (text, key) in [
            ("[[stage]]\npartitions = 0", "cluster.stage[0].partitions"),
            (
                "[[stage]]\n[[stage]]\ncolour = 1",
                "cluster.stage[1].colour",
            ),
            (
                "[[stage]]\ninstances = 5\nmax_instances = 4",
                "cluster.stage[0].instances",
            ),
            ("stage = 3", "cluster.stage"),
        ] {
            assert_eq!(parse(text).unwrap_err().0, key, "{text}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            ("partitions = 0", "cluster.partitions"),
            ("partitions = 5000", "cluster.partitions"),
            ("heartbeat = \"soon\"", "cluster.heartbeat"),
            ("heartbeat = \"0ms\"", "cluster.heartbeat"),
            ("address = \"::1\"", "cluster.address"),
            ("address = []", "cluster.address"),
            (
                "address = [\"192.0.2.1\", \"192.0.2.1\"]",
                "cluster.address",
            ),
            ("controller = \"here\"", "cluster.controller"),
            ("controller = []", "cluster.controller"),
            ("controller = [\"192.0.2.2\", 3]", "cluster.controller"),
            ("lease = \"0s\"", "cluster.lease"),
            ("store = \"mine\"", "cluster.store"),
            ("instances = 20", "cluster.instances"),
            (
                "min_instances = 3\nmax_instances = 2",
                "cluster.min_instances",
            ),
            ("scale_in_load = 0.9", "cluster.scale_in_load"),
            ("banana = 1", "cluster.banana"),
            ("moves = \"teleport\"", "cluster.moves"),
            ("key_file = 3", "cluster.key_file"),
            ("key_file = \"\"", "cluster.key_file"),
            ("clock_skew = \"0s\"", "cluster.clock_skew"),
            (
                "start_command = \"systemctl start x\"",
                "cluster.start_command",
            ),
            ("stop_command = 1", "cluster.stop_command"),
            ("unauthenticated = \"yes\"", "cluster.unauthenticated"),
            ("unfenced_store = 1", "cluster.unfenced_store"),
            (
                "unauthenticated = true\nkey_file = \"k\"",
                "cluster.unauthenticated",
            ),
            ("heartbeat = 50", "cluster.heartbeat"),
            ("straggler = 250", "cluster.straggler"),
        ] {
            assert_eq!(parse(text).unwrap_err().0, key, "{text}");
        }
        let (_, reason) = parse("move_timeout = 1").unwrap_err();
        assert!(reason.contains("\"1s\""), "{reason}");
    }

    #[test]
    fn every_error_is_reported() {
        let t = toml::from_str(
            "partitions = 0\nheartbeat = 50\nbanana = 1\n[[stage]]\ncolour = 1\n[[stage]]\npartitions = -1\n",
        )
        .unwrap();
        let errors = ClusterSection::from_table(&t).unwrap_err();
        let mut keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "cluster.banana",
                "cluster.heartbeat",
                "cluster.partitions",
                "cluster.stage[0].colour",
                "cluster.stage[1].partitions"
            ]
        );
        assert_eq!(
            parse("straggler = \"0s\"").unwrap().straggler,
            Duration::ZERO
        );
        assert_eq!(
            parse("move_timeout = \"1m30s\"").unwrap().move_timeout,
            Duration::from_secs(90)
        );
    }
}
