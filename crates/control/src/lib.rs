//! The control plane of HashMVT (§IV): instance agents report heartbeats, a coordinator decides
//! when to scale out, scale in or declare an instance failed, and a traffic dispatcher steers
//! packets by aggregated dispatch rules.
//!
//! Promises:
//! * [`Coordinator`] is sans-IO: heartbeats and the time are passed in, decisions come out as
//!   [`Action`]s, so every decision is tested under a virtual clock. [`spawn`] runs it on a
//!   thread fed by a channel of encoded heartbeats (the in-process deployment); the heartbeat
//!   wire format ([`heartbeat`]) is versioned and binary, ready for UDP between processes.
//! * Load is η = C_pkt / C_Total (Eq. 1), measured by the [`Agent`]; heartbeats also carry the
//!   active MVT entries, the free resources and the matching range (§IV-C).
//! * Scale-out is threshold-based and migration-free (§IV-B, §IV-D2): when the busiest
//!   instance's load or entries reach a threshold, a new instance starts, 80% of the busiest
//!   instance's free resources move to it ([`move_free`], an MVT shard; 20% stay), and the
//!   dispatch rules pin every older instance's matching range to it while new traffic goes to
//!   the new instance. Rules are aggregated to fit the rule budget
//!   ([`flowstate_mvt::dispatch::fit_budget`], §IV-D3), widening only into unpinned space, so
//!   no established flow changes instance.
//! * Failure detection: an instance not heard from for `missed_periods` intervals (default 2,
//!   §IV-D1) is reported failed once. Recovery is out of scope, as in the paper.
//! * Scale-in: when every instance has stayed below the low threshold for `scale_in_periods`
//!   heartbeats, an instance that no longer receives new flows and holds no active entry is
//!   retired, its pool combined into the instance taking new flows; again no flow moves.
//! * [`cluster`]: the multi-process cluster's controller (StatelessNF §4.2), sans-IO too:
//!   instances report over UDP, it publishes which instance owns each traffic partition (one
//!   owner, epochs, versions), fails dead instances over at once, and starts, drains and stops
//!   instances to a target.

pub mod cluster;
pub mod heartbeat;

pub use heartbeat::{DecodeError, Heartbeat};

use flowstate_mvt::dispatch::{fit_budget, Rule};
use flowstate_mvt::{Entry, EntryId, Field, Key, Match, Mvt, Nanos, NEVER};
use std::collections::BTreeMap;
use std::sync::mpsc;

/// Coordinator settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Heartbeat interval, ns (default 1 s, §IV-C).
    pub interval: Nanos,
    /// Intervals without a heartbeat before an instance is failed (default 2, §IV-D1).
    pub missed_periods: u32,
    /// Load η at which the busiest instance is scaled out (default 0.8).
    pub scale_out_load: f64,
    /// Active entries at which the busiest instance is scaled out (default: never).
    pub scale_out_entries: u64,
    /// Load η below which an instance counts as idle (default 0.2).
    pub scale_in_load: f64,
    /// Consecutive idle heartbeats of every instance before a scale-in (default 5).
    pub scale_in_periods: u32,
    /// Share of the busiest instance's free resources moved to a new instance (default 0.8).
    pub move_fraction: f64,
    /// Dispatch rules the dispatcher can hold (default 9325, the paper's NIC).
    pub rule_budget: usize,
    /// Instances at most (default 64).
    pub max_instances: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interval: 1_000_000_000,
            missed_periods: 2,
            scale_out_load: 0.8,
            scale_out_entries: u64::MAX,
            scale_in_load: 0.2,
            scale_in_periods: 5,
            move_fraction: 0.8,
            rule_budget: 9325,
            max_instances: 64,
        }
    }
}

/// What the coordinator decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start instance `new` and move `move_free` free resources of `from`'s pool to it.
    ScaleOut {
        /// The busiest instance.
        from: u32,
        /// The new instance.
        new: u32,
        /// Free resources to move (80% of `from`'s).
        move_free: u64,
    },
    /// Install these dispatch rules (longest prefix wins).
    Rules(Vec<Rule>),
    /// The rules did not fit the budget: the previous rules stay (new flows may keep going
    /// to an older instance; none breaks).
    OverBudget {
        /// Rules needed at least.
        needed: usize,
    },
    /// An instance missed its heartbeats.
    Failed {
        /// The instance.
        instance: u32,
    },
    /// Stop instance `instance` (it holds no state) and combine its pool into `into`.
    ScaleIn {
        /// The retired instance.
        instance: u32,
        /// The instance taking its pool.
        into: u32,
    },
}

#[derive(Debug, Clone)]
struct Instance {
    last_seen: Nanos,
    last: Option<Heartbeat>,
    idle: u32,
    failed: bool,
}

/// The coordinator (§IV-D): a state machine over heartbeats and time.
#[derive(Debug, Clone)]
pub struct Coordinator {
    config: Config,
    instances: BTreeMap<u32, Instance>,
    /// The instance new flows go to.
    newest: u32,
    next_id: u32,
    /// A scale-out waiting for the new instance's first heartbeat.
    pending: Option<u32>,
    rules: Vec<Rule>,
}

impl Coordinator {
    /// A coordinator with one instance, `first`, taking all traffic.
    pub fn new(config: Config, first: u32, now: Nanos) -> Self {
        let mut instances = BTreeMap::new();
        instances.insert(first, Instance::fresh(now));
        Coordinator {
            config,
            instances,
            newest: first,
            next_id: first + 1,
            pending: None,
            rules: vec![(Match::ANY, first)],
        }
    }

    /// The dispatch rules in force.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The instance new flows go to.
    pub fn newest(&self) -> u32 {
        self.newest
    }

    /// Instances alive (not failed, not retired).
    pub fn live(&self) -> impl Iterator<Item = u32> + '_ {
        self.instances
            .iter()
            .filter(|(_, i)| !i.failed)
            .map(|(id, _)| *id)
    }

    /// Records a heartbeat (an unknown instance or an old sequence number is ignored).
    pub fn on_heartbeat(&mut self, hb: Heartbeat, now: Nanos) {
        let Some(i) = self.instances.get_mut(&hb.instance) else {
            return;
        };
        if i.failed || i.last.as_ref().is_some_and(|l| l.seq >= hb.seq) {
            return;
        }
        i.last_seen = now;
        i.idle = if hb.load() < self.config.scale_in_load {
            i.idle.saturating_add(1)
        } else {
            0
        };
        if self.pending == Some(hb.instance) {
            self.pending = None;
        }
        i.last = Some(hb);
    }

    /// Decides what to do at `now`.
    pub fn tick(&mut self, now: Nanos) -> Vec<Action> {
        let mut out = Vec::new();
        let deadline = self
            .config
            .interval
            .saturating_mul(u64::from(self.config.missed_periods));
        let mut failed_any = false;
        for (id, i) in &mut self.instances {
            if !i.failed && now.saturating_sub(i.last_seen) > deadline {
                i.failed = true;
                failed_any = true;
                out.push(Action::Failed { instance: *id });
                if self.pending == Some(*id) {
                    self.pending = None;
                }
            }
        }
        if failed_any && self.instances.get(&self.newest).is_some_and(|i| i.failed) {
            if let Some(id) = self.live().last() {
                self.newest = id;
            }
        }
        if let Some(a) = self.scale_out() {
            out.push(a);
            self.push_rules(&mut out);
        } else if let Some(a) = self.scale_in() {
            out.push(a);
            self.push_rules(&mut out);
        } else if failed_any {
            self.push_rules(&mut out);
        }
        out
    }

    fn scale_out(&mut self) -> Option<Action> {
        if self.pending.is_some() || self.live().count() >= self.config.max_instances {
            return None;
        }
        let (from, hb) = self
            .instances
            .iter()
            .filter(|(_, i)| !i.failed)
            .filter_map(|(id, i)| i.last.as_ref().map(|h| (*id, h)))
            .max_by(|a, b| a.1.load().total_cmp(&b.1.load()))?;
        if hb.load() < self.config.scale_out_load
            && hb.active_entries < self.config.scale_out_entries
        {
            return None;
        }
        let move_free = (hb.free_resources as f64 * self.config.move_fraction) as u64;
        let new = self.next_id;
        self.next_id += 1;
        self.instances.insert(
            new,
            Instance::fresh(self.instances[&from].last_seen.max(hb.sent_at)),
        );
        self.newest = new;
        self.pending = Some(new);
        Some(Action::ScaleOut {
            from,
            new,
            move_free,
        })
    }

    fn scale_in(&mut self) -> Option<Action> {
        let live: Vec<u32> = self.live().collect();
        if live.len() < 2 || self.pending.is_some() {
            return None;
        }
        let all_idle = live.iter().all(|id| {
            let i = &self.instances[id];
            i.last.is_some() && i.idle >= self.config.scale_in_periods
        });
        if !all_idle {
            return None;
        }
        let empty = live.iter().copied().find(|id| {
            *id != self.newest
                && self.instances[id]
                    .last
                    .as_ref()
                    .is_some_and(|h| h.active_entries == 0)
        })?;
        self.instances.remove(&empty);
        for i in self.instances.values_mut() {
            i.idle = 0;
        }
        Some(Action::ScaleIn {
            instance: empty,
            into: self.newest,
        })
    }

    /// Rules: every live instance other than the newest keeps its matching range; the rest of
    /// the space goes to the newest.
    fn push_rules(&mut self, out: &mut Vec<Action>) {
        let mut pins: Vec<Rule> = Vec::new();
        for (id, i) in &self.instances {
            if i.failed || *id == self.newest {
                continue;
            }
            if let Some(h) = &i.last {
                pins.extend(h.range.iter().map(|m| (*m, *id)));
            }
        }
        match fit_budget(&pins, Some(self.newest), self.config.rule_budget) {
            Ok(rules) => {
                self.rules = rules.clone();
                out.push(Action::Rules(rules));
            }
            Err(e) => out.push(Action::OverBudget { needed: e.needed }),
        }
    }
}

impl Instance {
    fn fresh(now: Nanos) -> Self {
        Instance {
            last_seen: now,
            last: None,
            idle: 0,
            failed: false,
        }
    }
}

/// An instance agent (§IV-C): accumulates busy and total cycles between heartbeats.
#[derive(Debug, Clone, Default)]
pub struct Agent {
    instance: u32,
    seq: u64,
    busy: u64,
    total: u64,
}

impl Agent {
    /// The agent of `instance`.
    pub fn new(instance: u32) -> Self {
        Agent {
            instance,
            ..Agent::default()
        }
    }

    /// Accounts `busy` cycles spent on packets out of `total` cycles (Eq. 1).
    pub fn record(&mut self, busy: u64, total: u64) {
        self.busy = self.busy.saturating_add(busy.min(total));
        self.total = self.total.saturating_add(total);
    }

    /// The heartbeat of the interval ending at `now`, which starts the next interval.
    pub fn heartbeat(
        &mut self,
        now: Nanos,
        active_entries: u64,
        free_resources: u64,
        range: Vec<Match>,
    ) -> Heartbeat {
        self.seq += 1;
        let hb = Heartbeat {
            instance: self.instance,
            seq: self.seq,
            sent_at: now,
            busy_cycles: self.busy,
            total_cycles: self.total,
            active_entries,
            free_resources,
            range,
        };
        self.busy = 0;
        self.total = 0;
        hb
    }
}

/// Moves `fraction` of the free entries of `table` (those `is_free` says are free) to a new
/// table, the last ones in pool order, so the entries the old instance hands out next stay
/// (§IV-D2: 80% move, 20% stay). An MVT shard: nothing else moves.
pub fn move_free<V>(
    table: &mut Mvt<V>,
    fraction: f64,
    is_free: impl Fn(&Entry<V>) -> bool,
) -> Mvt<V> {
    let free = table.iter().filter(|(_, e)| is_free(e)).count();
    let moving = ((free as f64) * fraction.clamp(0.0, 1.0)) as usize;
    let mut skip = free - moving;
    table.shard(|e| {
        if !is_free(e) {
            return false;
        }
        if skip > 0 {
            skip -= 1;
            return false;
        }
        true
    })
}

/// The traffic dispatcher (§IV-B): steers a packet's key to an instance by the installed
/// rules. Lookups go through an MVT (hash matching, state cache) and allocate nothing; rules
/// are swapped between batches by [`Dispatcher::install`].
#[derive(Debug)]
pub struct Dispatcher {
    field: Field,
    table: Mvt<u32>,
}

impl Dispatcher {
    /// A dispatcher on `field` sending everything to `first`.
    pub fn new(field: Field, first: u32) -> Self {
        let mut d = Dispatcher {
            field,
            table: Mvt::new(field.width()),
        };
        d.install(&[(Match::ANY, first)]);
        d
    }

    /// The field it steers by.
    pub fn field(&self) -> Field {
        self.field
    }

    /// Replaces the rules.
    pub fn install(&mut self, rules: &[Rule]) {
        let mut t = Mvt::with_capacity(self.field.width(), rules.len());
        for (m, id) in rules {
            let _ = t.insert(Entry::new(*m, *id, 0, NEVER, 0));
        }
        self.table = t;
    }

    /// Rules installed.
    pub fn rules(&self) -> usize {
        self.table.len()
    }

    /// The instance for `key`, `None` when no rule matches.
    #[inline]
    pub fn steer(&mut self, key: &Key) -> Option<u32> {
        let id: EntryId = self.table.lookup(key)?;
        self.table.get(id).copied()
    }
}

/// What the coordinator thread takes in.
#[derive(Debug)]
pub enum Input {
    /// An encoded heartbeat (undecodable ones are dropped and counted).
    Heartbeat(Vec<u8>),
    /// The time is now this (a real or a virtual clock).
    Tick(Nanos),
}

/// The coordinator on its own thread: heartbeats and ticks in, actions out. Ends when every
/// sender is dropped; returns the count of undecodable heartbeats.
pub fn spawn(
    coordinator: Coordinator,
) -> (
    mpsc::Sender<Input>,
    mpsc::Receiver<Action>,
    std::thread::JoinHandle<u64>,
) {
    let (tx, rx) = mpsc::channel::<Input>();
    let (atx, arx) = mpsc::channel();
    let join = std::thread::spawn(move || {
        let mut c = coordinator;
        let mut now = 0;
        let mut bad = 0u64;
        for input in rx {
            match input {
                Input::Heartbeat(b) => match Heartbeat::decode(&b) {
                    Ok(hb) => c.on_heartbeat(hb, now),
                    Err(_) => bad += 1,
                },
                Input::Tick(t) => {
                    now = now.max(t);
                    for a in c.tick(now) {
                        if atx.send(a).is_err() {
                            return bad;
                        }
                    }
                }
            }
        }
        bad
    });
    (tx, arx, join)
}

#[cfg(test)]
mod tests;
