//! Coordinator, agents and dispatcher under a virtual clock, with simulated NAT instances
//! whose pools are MVTs (free entries match `*`, an allocated one matches its inside host).

use super::*;
use std::net::Ipv4Addr;

const SEC: Nanos = 1_000_000_000;

/// A NAT instance reduced to its MVT: free ports match `*`, a flow's port matches its host.
struct Sim {
    agent: Agent,
    pool: Mvt<u16>,
    hosts: Vec<u32>,
    load: f64,
}

impl Sim {
    fn new(id: u32, pool: Mvt<u16>) -> Sim {
        Sim {
            agent: Agent::new(id),
            pool,
            hosts: Vec::new(),
            load: 0.5,
        }
    }

    fn with_ports(id: u32, n: u16) -> Sim {
        let mut pool = Mvt::new(32);
        for p in 0..n {
            pool.insert(Entry::new(Match::ANY, 1024 + p, 0, NEVER, 0))
                .unwrap();
        }
        Sim::new(id, pool)
    }

    fn free(&self) -> u64 {
        self.pool
            .iter()
            .filter(|(_, e)| e.matching().is_any())
            .count() as u64
    }

    /// A new flow from `host`: takes the first free port.
    fn open(&mut self, host: u32) -> bool {
        let Some(id) = self.pool.find(&Match::ANY) else {
            return false;
        };
        self.pool
            .rematch(id, Match::exact(&Key::v4_u32(host)))
            .unwrap();
        self.hosts.push(host);
        true
    }

    fn heartbeat(&mut self, now: Nanos) -> Heartbeat {
        self.agent.record((self.load * 1000.0) as u64, 1000);
        let range = self
            .hosts
            .iter()
            .map(|h| Match::exact(&Key::v4_u32(*h)))
            .collect();
        let active = self.hosts.len() as u64;
        let free = self.free();
        self.agent.heartbeat(now, active, free, range)
    }
}

struct World {
    coord: Coordinator,
    disp: Dispatcher,
    sims: BTreeMap<u32, Sim>,
    now: Nanos,
    next_host: u32,
    actions: Vec<Action>,
}

impl World {
    fn new(config: Config, ports: u16) -> World {
        let mut sims = BTreeMap::new();
        sims.insert(0, Sim::with_ports(0, ports));
        World {
            coord: Coordinator::new(config, 0, 0),
            disp: Dispatcher::new(Field::SrcV4, 0),
            sims,
            now: 0,
            next_host: 0,
            actions: Vec::new(),
        }
    }

    /// New flows from `n` new hosts (spread over 10.0.0.0/16 in a scattered order).
    fn new_flows(&mut self, n: u32) {
        for _ in 0..n {
            let h = 0x0a00_0000 | (self.next_host.wrapping_mul(40_503) & 0xffff);
            self.next_host += 1;
            let to = self.disp.steer(&Key::v4_u32(h)).expect("a rule matches");
            assert!(self
                .sims
                .get_mut(&to)
                .expect("steered to a live instance")
                .open(h));
        }
    }

    /// One second: heartbeats from every instance in `beating`, then a coordinator tick, then
    /// its actions applied.
    fn second(&mut self, beating: &[u32]) {
        self.now += SEC;
        for id in beating {
            if let Some(s) = self.sims.get_mut(id) {
                let hb = s.heartbeat(self.now);
                // Through the wire format, as a remote agent would send it.
                let hb = Heartbeat::decode(&hb.encode()).unwrap();
                self.coord.on_heartbeat(hb, self.now);
            }
        }
        let actions = self.coord.tick(self.now);
        for a in &actions {
            match a {
                Action::ScaleOut {
                    from,
                    new,
                    move_free,
                } => {
                    let old = self.sims.get_mut(from).unwrap();
                    let moved = super::move_free(&mut old.pool, 0.8, |e: &Entry<u16>| {
                        e.matching().is_any()
                    });
                    assert_eq!(moved.len() as u64, *move_free);
                    self.sims.insert(*new, Sim::new(*new, moved));
                }
                Action::Rules(r) => self.disp.install(r),
                Action::ScaleIn { instance, into } => {
                    let gone = self.sims.remove(instance).unwrap();
                    assert!(gone.hosts.is_empty());
                    self.sims
                        .get_mut(into)
                        .unwrap()
                        .pool
                        .combine(gone.pool)
                        .unwrap();
                }
                Action::Failed { .. } | Action::OverBudget { .. } => {}
            }
        }
        self.actions.extend(actions);
    }

    /// Established flows the dispatcher would now send to another instance than theirs.
    fn broken(&mut self) -> usize {
        let mut n = 0;
        let all: Vec<(u32, u32)> = self
            .sims
            .iter()
            .flat_map(|(id, s)| s.hosts.iter().map(move |h| (*id, *h)))
            .collect();
        for (id, h) in all {
            n += usize::from(self.disp.steer(&Key::v4_u32(h)) != Some(id));
        }
        n
    }
}

#[test]
fn scale_out_moves_80_percent_of_the_pool_and_no_flow() {
    let mut w = World::new(Config::default(), 1000);
    for _ in 0..3 {
        w.new_flows(40);
        w.second(&[0]);
    }
    assert!(w.actions.is_empty(), "{:?}", w.actions);
    w.sims.get_mut(&0).unwrap().load = 0.9;
    let free_before = w.sims[&0].free();
    w.second(&[0]);
    assert!(matches!(
        w.actions[0],
        Action::ScaleOut { from: 0, new: 1, move_free } if move_free == free_before * 8 / 10
    ));
    assert!(matches!(w.actions[1], Action::Rules(_)));
    assert_eq!(w.sims[&0].free(), free_before - free_before * 8 / 10);
    assert_eq!(w.sims[&1].free(), free_before * 8 / 10);
    assert_eq!(w.broken(), 0);
    // New flows go to the new instance; old ones stay.
    let before0 = w.sims[&0].hosts.len();
    w.new_flows(50);
    assert_eq!(w.sims[&0].hosts.len(), before0);
    assert_eq!(w.sims[&1].hosts.len(), 50);
    assert_eq!(w.broken(), 0);
    // No second scale-out before the new instance reports, then a third instance for the
    // busy second one, still without breaking a flow.
    w.second(&[0]);
    assert_eq!(w.actions.len(), 2);
    w.sims.get_mut(&0).unwrap().load = 0.5;
    w.sims.get_mut(&1).unwrap().load = 0.95;
    w.second(&[0, 1]);
    assert!(w.actions.iter().any(|a| matches!(
        a,
        Action::ScaleOut {
            from: 1,
            new: 2,
            ..
        }
    )));
    w.new_flows(30);
    assert_eq!(w.sims[&2].hosts.len(), 30);
    assert_eq!(w.broken(), 0);
}

#[test]
fn rules_fit_the_budget_without_breaking_flows() {
    let config = Config {
        rule_budget: 6,
        ..Config::default()
    };
    let mut w = World::new(config, 2000);
    w.new_flows(300);
    w.sims.get_mut(&0).unwrap().load = 0.9;
    w.second(&[0]);
    let Some(Action::Rules(r)) = w.actions.get(1) else {
        panic!("{:?}", w.actions)
    };
    assert!(r.len() <= 6, "{} rules", r.len());
    assert_eq!(w.disp.rules(), r.len());
    assert_eq!(w.broken(), 0);
    // Hosts outside the pinned space go to the new instance.
    assert_eq!(w.disp.steer(&Key::v4(Ipv4Addr::new(192, 0, 2, 1))), Some(1));
}

#[test]
fn missed_heartbeats_fail_an_instance_once() {
    let config = Config {
        missed_periods: 2,
        ..Config::default()
    };
    let mut w = World::new(config, 100);
    w.sims.get_mut(&0).unwrap().load = 0.9;
    w.second(&[0]);
    w.sims.get_mut(&0).unwrap().load = 0.5;
    w.second(&[0, 1]);
    let n = w.actions.len();
    // Instance 1 goes silent: two periods are tolerated, the third is not.
    w.second(&[0]);
    w.second(&[0]);
    assert_eq!(w.actions.len(), n, "{:?}", &w.actions[n..]);
    w.second(&[0]);
    assert_eq!(w.actions[n], Action::Failed { instance: 1 });
    // New flows go to a live instance again.
    assert_eq!(w.coord.newest(), 0);
    assert!(matches!(w.actions.get(n + 1), Some(Action::Rules(_))));
    w.second(&[0]);
    w.second(&[0]);
    assert_eq!(
        w.actions
            .iter()
            .filter(|a| matches!(a, Action::Failed { .. }))
            .count(),
        1
    );
    assert_eq!(w.coord.live().collect::<Vec<_>>(), vec![0]);
}

#[test]
fn scale_in_retires_an_idle_empty_instance() {
    let config = Config {
        scale_in_periods: 3,
        ..Config::default()
    };
    let mut w = World::new(config, 100);
    w.sims.get_mut(&0).unwrap().load = 0.9;
    w.second(&[0]);
    w.sims.get_mut(&0).unwrap().load = 0.1;
    w.sims.get_mut(&1).unwrap().load = 0.1;
    w.second(&[0, 1]);
    w.second(&[0, 1]);
    assert!(!w
        .actions
        .iter()
        .any(|a| matches!(a, Action::ScaleIn { .. })));
    w.second(&[0, 1]);
    assert!(w.actions.contains(&Action::ScaleIn {
        instance: 0,
        into: 1
    }));
    assert_eq!(w.sims[&1].free(), 100, "the pools are one again");
    assert_eq!(w.broken(), 0);
    assert_eq!(w.disp.steer(&Key::v4(Ipv4Addr::new(10, 0, 0, 1))), Some(1));
}

#[test]
fn an_instance_holding_flows_is_not_scaled_in() {
    let config = Config {
        scale_in_periods: 2,
        ..Config::default()
    };
    let mut w = World::new(config, 100);
    w.new_flows(3);
    w.sims.get_mut(&0).unwrap().load = 0.9;
    w.second(&[0]);
    w.sims.get_mut(&0).unwrap().load = 0.0;
    w.sims.get_mut(&1).unwrap().load = 0.0;
    for _ in 0..6 {
        w.second(&[0, 1]);
    }
    assert!(!w
        .actions
        .iter()
        .any(|a| matches!(a, Action::ScaleIn { .. })));
    assert_eq!(w.broken(), 0);
}

#[test]
fn the_coordinator_thread_takes_encoded_heartbeats() {
    let (tx, rx, join) = spawn(Coordinator::new(Config::default(), 0, 0));
    let mut agent = Agent::new(0);
    agent.record(950, 1000);
    let hb = agent.heartbeat(
        SEC,
        10,
        500,
        vec![Match::v4(Ipv4Addr::new(10, 0, 0, 0), 24)],
    );
    tx.send(Input::Heartbeat(b"garbage".to_vec())).unwrap();
    tx.send(Input::Heartbeat(hb.encode())).unwrap();
    tx.send(Input::Tick(SEC)).unwrap();
    assert_eq!(
        rx.recv().unwrap(),
        Action::ScaleOut {
            from: 0,
            new: 1,
            move_free: 400
        }
    );
    let Action::Rules(r) = rx.recv().unwrap() else {
        panic!("rules expected")
    };
    assert_eq!(
        r,
        vec![
            (Match::ANY, 1),
            (Match::v4(Ipv4Addr::new(10, 0, 0, 0), 24), 0)
        ]
    );
    drop(tx);
    assert_eq!(join.join().unwrap(), 1);
}
