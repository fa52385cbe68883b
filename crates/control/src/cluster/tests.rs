//! The controller under a virtual clock, with simulated instances that report what the current
//! assignment gives them.

use super::*;
use proptest::prelude::*;

const MS: Nanos = 1_000_000;
/// The default interval.
const I: Nanos = 50 * MS;
/// The default failure deadline: 3 missed intervals.
const DEADLINE: Nanos = 3 * I;
const START_TIMEOUT: Nanos = 10_000 * MS;

fn addr(id: InstanceId) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, id as u8, 2), 7000)
}

fn owners(a: &Assignment) -> Vec<Option<InstanceId>> {
    a.slots.iter().map(|s| s.owner).collect()
}

fn counts(a: &Assignment) -> BTreeMap<InstanceId, usize> {
    let mut c = BTreeMap::new();
    for s in &a.slots {
        if let Some(id) = s.owner {
            *c.entry(id).or_default() += 1;
        }
    }
    c
}

fn published(d: &[Decision]) -> Vec<&Assignment> {
    d.iter()
        .filter_map(|d| match d {
            Decision::Publish(a) => Some(a),
            _ => None,
        })
        .collect()
}

fn state_of(c: &Controller, id: InstanceId, now: Nanos) -> Option<MemberState> {
    c.status(now).iter().find(|m| m.id == id).map(|m| m.state)
}

/// A controller and the instances around it, under a virtual clock.
struct Sim {
    c: Controller,
    now: Nanos,
    seq: BTreeMap<InstanceId, u64>,
    load: f64,
    /// The store errors every instance reports.
    store_trouble: u64,
}

impl Sim {
    fn new(config: ClusterConfig) -> Sim {
        Sim {
            c: Controller::new(config, None, 0),
            now: 0,
            seq: BTreeMap::new(),
            load: 0.5,
            store_trouble: 0,
        }
    }

    /// `id`'s next report: it serves what the assignment gives it.
    fn report(&mut self, id: InstanceId) -> Report {
        let seq = self.seq.entry(id).or_default();
        *seq += 1;
        let a = self.c.assignment();
        Report {
            stage: 0,
            id,
            addr: addr(id),
            pid: 1000 + id,
            seq: *seq,
            load: self.load,
            partitions: a.owned_by(id),
            packets: 10,
            drops: 1,
            entries: 5,
            assignment_version: a.version,
            store_trouble: self.store_trouble,
        }
    }

    fn send(&mut self, id: InstanceId) {
        let r = self.report(id);
        self.c.on_report(&r, self.now);
    }

    /// One interval: `ids` report, then a tick.
    fn step(&mut self, ids: &[InstanceId]) -> Vec<Decision> {
        self.now += I;
        for id in ids {
            self.send(*id);
        }
        self.c.tick(self.now)
    }

    /// Steps with `ids` reporting until a tick decides something (at most the failure
    /// deadline and one interval); what it decided.
    fn step_until_decided(&mut self, ids: &[InstanceId]) -> Vec<Decision> {
        for _ in 0..=DEADLINE / I {
            let d = self.step(ids);
            if !d.is_empty() {
                return d;
            }
        }
        Vec::new()
    }

    /// Instances 1..=n live with balanced partitions, started by the controller.
    fn cluster(n: u32) -> Sim {
        let mut s = Sim::new(ClusterConfig::default());
        s.c.scale(n, 0).unwrap();
        let d = s.c.tick(0);
        assert_eq!(
            d,
            (1..=n).map(|id| Decision::Start { id }).collect::<Vec<_>>()
        );
        let ids: Vec<InstanceId> = (1..=n).collect();
        assert_eq!(published(&s.step(&ids)).len(), 1);
        assert!(s.step(&ids).is_empty());
        s
    }
}

#[test]
fn a_straggler_is_failed_over_when_another_instance_keeps_up() {
    let mut s = Sim::cluster(3);
    let before = s.c.assignment().clone();
    let lag = |ns: &[(InstanceId, Nanos)]| Lag {
        stage: 0,
        lags: ns.to_vec(),
    };
    // Instance 2's packets wait 300 ms in two root reports, then a fast one: nothing yet.
    for waits in [300, 300, 1, 300, 300] {
        s.c.on_lag(0, &lag(&[(1, MS), (2, waits * MS), (3, MS)]), s.now);
        assert!(s.step(&[1, 2, 3]).is_empty());
    }
    // The third slow report in a row: failed over (its partitions to 1 and 3), replaced.
    s.c.on_lag(0, &lag(&[(1, MS), (2, 300 * MS), (3, MS)]), s.now);
    let d = s.step(&[1, 2, 3]);
    assert_eq!(
        d[0],
        Decision::Straggler {
            id: 2,
            lag_ns: 300 * MS
        }
    );
    assert_eq!(d.last(), Some(&Decision::Start { id: 2 }));
    let a = published(&d)[0];
    assert_eq!(counts(a).get(&2), None);
    for (old, new) in before.slots.iter().zip(&a.slots) {
        assert_eq!(old.owner == Some(2), new.epoch == old.epoch + 1);
    }
    // A stage that is slow as a whole loses nobody (it needs more instances, not fewer).
    let mut s = Sim::cluster(2);
    for _ in 0..5 {
        s.c.on_lag(0, &lag(&[(1, 400 * MS), (2, 400 * MS)]), s.now);
        assert!(s.step(&[1, 2]).is_empty());
    }
    // Packets that wait for the store (its commits failing: a master failing over) do not
    // make a straggler.
    let mut s = Sim::cluster(3);
    for _ in 0..5 {
        s.store_trouble += 1;
        s.c.on_lag(0, &lag(&[(1, MS), (2, 300 * MS), (3, MS)]), s.now);
        assert!(s.step(&[1, 2, 3]).is_empty());
    }
    // Two roots measure apart: root 1's fast reports do not hide root 0's slow ones.
    let mut s = Sim::cluster(3);
    for (i, root) in [0, 1, 0, 1, 0].into_iter().enumerate() {
        let waits = if root == 0 { 300 } else { 1 };
        s.c.on_lag(root, &lag(&[(1, MS), (2, waits * MS), (3, MS)]), s.now);
        let d = s.step(&[1, 2, 3]);
        assert_eq!(d.is_empty(), i < 4, "{d:?}");
    }
    // Off: never.
    let mut s = Sim::cluster(2);
    s.c.config.straggler = 0;
    for _ in 0..5 {
        s.c.on_lag(0, &lag(&[(1, MS), (2, 10_000 * MS)]), s.now);
        assert!(s.step(&[1, 2]).is_empty());
    }
}

proptest! {
    #[test]
    fn lag_reports_round_trip_and_garbage_never_panics(
        stage: u32,
        lags in prop::collection::vec((1u32.., any::<u64>()), 0..20),
        junk in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let l = Lag { stage, lags };
        prop_assert_eq!(Lag::decode(&l.encode()), Ok(l.clone()));
        let mut cut = l.encode();
        cut.pop();
        prop_assert!(Lag::decode(&cut).is_err());
        let _ = Lag::decode(&junk);
    }
}

#[test]
fn assignment_round_trips_and_rejects_garbage() {
    let a = Assignment {
        version: 7,
        term: 4,
        stage: 1,
        slots: vec![
            Slot {
                owner: Some(2),
                epoch: 3,
            },
            Slot {
                owner: None,
                epoch: 9,
            },
        ],
        members: vec![
            MemberAddr {
                id: 2,
                addr: addr(2),
                live: true,
                draining: false,
            },
            MemberAddr {
                id: 5,
                addr: addr(5),
                live: true,
                draining: true,
            },
            MemberAddr {
                id: 6,
                addr: addr(6),
                live: false,
                draining: false,
            },
        ],
    };
    let b = a.encode();
    assert_eq!(Assignment::decode(&b), Ok(a.clone()));
    assert_eq!(a.owned_by(2), vec![0]);
    assert_eq!(a.member(5).map(|m| m.draining), Some(true));
    assert_eq!(a.member(3), None);
    for cut in 0..b.len() {
        assert!(Assignment::decode(&b[..cut]).is_err(), "cut at {cut}");
    }
    let mut v = b.clone();
    v[4] = 1;
    assert_eq!(Assignment::decode(&v), Err(DecodeError::Version(1)));
    let mut long = b.clone();
    long.push(0);
    assert_eq!(Assignment::decode(&long), Err(DecodeError::Trailing));
    let mut flags = b.clone();
    *flags.last_mut().unwrap() = 4;
    assert_eq!(
        Assignment::decode(&flags),
        Err(DecodeError::Invalid("member flags"))
    );
    assert_eq!(Assignment::decode(&[]), Err(DecodeError::Truncated));
    // Format 2, as stored before terms: the same without the term, read as term 0.
    let mut two = b.clone();
    two[4] = 2;
    two.drain(13..21);
    assert_eq!(
        Assignment::decode(&two),
        Ok(Assignment {
            term: 0,
            ..a.clone()
        })
    );
    let mut magic = b;
    magic[0] = b'X';
    assert_eq!(Assignment::decode(&magic), Err(DecodeError::Magic));
}

#[test]
fn a_new_leader_publishes_the_same_owners_in_its_term() {
    let mut s = Sim::cluster(3);
    let before = s.c.assignment().clone();
    let a = s.c.lead(before.term + 1).expect("published");
    assert_eq!((a.term, a.version), (before.term + 1, before.version + 1));
    assert_eq!((&a.slots, &a.members), (&before.slots, &before.members));
    assert!(s.step(&[1, 2, 3]).is_empty(), "nothing else changes");
    // Later changes keep the term: instance 3 stops reporting.
    let d = (0..10).flat_map(|_| s.step(&[1, 2])).collect::<Vec<_>>();
    let last = *published(&d).last().expect("3 failed over");
    assert_eq!((last.term, last.owned_by(3)), (before.term + 1, vec![]));
}

#[test]
fn a_join_moves_the_fewest_partitions_one_at_a_time_from_the_largest_holder() {
    let mut s = Sim::cluster(1);
    s.c.scale(2, s.now).unwrap();
    assert_eq!(s.step(&[1]), vec![Decision::Start { id: 2 }]);
    let before = s.c.assignment().clone();
    let d = s.step(&[1, 2]);
    let after = published(&d)[0].clone();
    assert_eq!(counts(&after), BTreeMap::from([(1, 8), (2, 8)]));
    s.c.scale(3, s.now).unwrap();
    assert_eq!(s.step(&[1, 2]), vec![Decision::Start { id: 3 }]);
    let d = s.step(&[1, 2, 3]);
    let third = published(&d)[0];
    // 8/8/0 -> 5/6/5: five moves, all to the new instance, alternating from the largest.
    assert_eq!(counts(third), BTreeMap::from([(1, 5), (2, 6), (3, 5)]));
    let mut moved = 0;
    for (old, new) in after.slots.iter().zip(&third.slots) {
        if old.owner == new.owner {
            assert_eq!(old.epoch, new.epoch, "an unmoved slot keeps its epoch");
        } else {
            moved += 1;
            assert_eq!(
                new.owner,
                Some(3),
                "no move between instances that keep running"
            );
            assert_eq!(new.epoch, old.epoch + 1);
        }
    }
    assert_eq!(moved, 5);
    assert!(third.version > after.version && after.version > before.version);
}

#[test]
fn the_same_input_publishes_nothing() {
    let mut s = Sim::cluster(3);
    let a = s.c.assignment().clone();
    for i in 0..200 {
        s.load = (i % 10) as f64 / 10.0;
        assert!(s.step(&[1, 2, 3]).is_empty());
    }
    assert_eq!(s.c.assignment(), &a);
}

#[test]
fn a_silent_instance_is_failed_once_at_the_deadline_and_failed_over_in_the_same_tick() {
    let mut s = Sim::cluster(3);
    let before = s.c.assignment().clone();
    s.send(1);
    s.send(2);
    s.send(3);
    let last = s.now;
    for t in [I, 2 * I, DEADLINE] {
        s.now = last + t;
        s.send(1);
        s.send(3);
        assert!(s.c.tick(s.now).is_empty(), "not dead at +{t}");
    }
    s.now = last + DEADLINE + 1;
    s.send(1);
    s.send(3);
    let d = s.c.tick(s.now);
    assert_eq!(d.len(), 3, "{d:?}");
    assert_eq!(d[0], Decision::Failed { id: 2 });
    assert_eq!(d[2], Decision::Start { id: 2 }, "the target is still 3");
    let a = published(&d)[0];
    assert_eq!(a.version, before.version + 1);
    assert_eq!(counts(a), BTreeMap::from([(1, 8), (3, 8)]));
    for (old, new) in before.slots.iter().zip(&a.slots) {
        if old.owner == Some(2) {
            assert_eq!(new.epoch, old.epoch + 1);
        } else {
            assert_eq!(old, new, "only the dead instance's partitions move");
        }
    }
    assert_eq!(
        a.member(2),
        Some(&MemberAddr {
            id: 2,
            addr: addr(2),
            live: false,
            draining: false
        })
    );
    assert_eq!(state_of(&s.c, 2, s.now), Some(MemberState::Starting));
    for _ in 0..10 {
        assert!(s.step(&[1, 3]).is_empty(), "failed only once");
    }
}

#[test]
fn a_standby_takes_a_failed_instances_partitions_and_another_standby_starts() {
    let mut s = Sim::new(ClusterConfig {
        standby: 1,
        ..ClusterConfig::default()
    });
    s.c.scale(3, 0).unwrap();
    let starts: Vec<Decision> = (1..=4).map(|id| Decision::Start { id }).collect();
    assert_eq!(s.c.tick(0), starts, "three for the target and a standby");
    // The first three to report are live; the fourth, beyond the target, stands by.
    let d = s.step(&[1, 2, 3, 4]);
    assert_eq!(
        counts(published(&d)[0]),
        BTreeMap::from([(1, 6), (2, 5), (3, 5)])
    );
    assert_eq!(state_of(&s.c, 4, s.now), Some(MemberState::Standby));
    assert!(
        s.step(&[1, 2, 3, 4]).is_empty(),
        "a standby changes nothing"
    );
    let before = s.c.assignment().clone();
    // Instance 1 falls silent: its partitions, and only them, go to the standby (up to an even
    // share, the rest to the fewest) in the tick that fails it; a new standby starts under the
    // free id.
    let d = s.step_until_decided(&[2, 3, 4]);
    assert_eq!(d[0], Decision::Failed { id: 1 });
    assert_eq!(d.last(), Some(&Decision::Start { id: 1 }), "{d:?}");
    let a = published(&d)[0];
    assert_eq!(counts(a), BTreeMap::from([(2, 6), (3, 5), (4, 5)]));
    for (old, new) in before.slots.iter().zip(&a.slots) {
        if old.owner != Some(1) {
            assert_eq!(old, new, "only the failed instance's partitions move");
        }
    }
    assert_eq!(state_of(&s.c, 4, s.now), Some(MemberState::Live));
    // The new process stands by: no partition moves when it reports (the assignment lists
    // it as live again).
    let owned = owners(a);
    let same_owners = |d: &[Decision]| published(d).iter().all(|a| owners(a) == owned);
    assert!(same_owners(&s.step(&[1, 2, 3, 4])));
    assert_eq!(state_of(&s.c, 1, s.now), Some(MemberState::Standby));
    // A failed standby is only replaced; scaling out promotes the standby (and starts
    // another); scaling in drains a live instance and keeps the standby.
    let d = s.step_until_decided(&[2, 3, 4]);
    assert_eq!(d[0], Decision::Failed { id: 1 });
    assert_eq!(d.last(), Some(&Decision::Start { id: 1 }));
    assert!(same_owners(&d));
    assert!(same_owners(&s.step(&[1, 2, 3, 4])));
    s.c.scale(4, s.now).unwrap();
    let d = s.step(&[1, 2, 3, 4]);
    assert_eq!(counts(published(&d)[0]).get(&1), Some(&4), "{d:?}");
    assert_eq!(d.last(), Some(&Decision::Start { id: 5 }));
    s.step(&[1, 2, 3, 4, 5]);
    assert_eq!(state_of(&s.c, 5, s.now), Some(MemberState::Standby));
    s.c.scale(3, s.now).unwrap();
    s.step(&[1, 2, 3, 4, 5]);
    assert_eq!(state_of(&s.c, 4, s.now), Some(MemberState::Draining));
    assert_eq!(state_of(&s.c, 5, s.now), Some(MemberState::Standby));
}

#[test]
fn a_restarted_controller_finds_its_standby_again() {
    let config = ClusterConfig {
        standby: 1,
        ..ClusterConfig::default()
    };
    let mut s = Sim::new(config.clone());
    s.c.scale(2, 0).unwrap();
    s.c.tick(0);
    s.step(&[1, 2, 3]);
    assert_eq!(state_of(&s.c, 3, s.now), Some(MemberState::Standby));
    let c = Controller::new(config, Some(s.c.assignment().clone()), s.now);
    assert_eq!(c.target(), 2);
    assert_eq!(state_of(&c, 3, s.now), Some(MemberState::Standby));
}

#[test]
fn a_started_instance_never_heard_from_is_failed_and_its_id_is_free_again() {
    let mut s = Sim::cluster(1);
    s.c.scale(2, s.now).unwrap();
    let started = s.now;
    assert_eq!(s.c.tick(started), vec![Decision::Start { id: 2 }]);
    while s.now + I <= started + START_TIMEOUT {
        assert!(s.step(&[1]).is_empty());
    }
    s.now = started + START_TIMEOUT;
    s.send(1);
    assert!(s.c.tick(s.now).is_empty());
    s.now += 1;
    s.send(1);
    // Failed, and started again under the same id: no member ever had an address, so the
    // assignment does not change.
    assert_eq!(
        s.c.tick(s.now),
        vec![Decision::Failed { id: 2 }, Decision::Start { id: 2 }]
    );
}

#[test]
fn scale_outside_the_bounds_is_an_error_naming_the_bound() {
    let mut c = Controller::new(
        ClusterConfig {
            min_instances: 0,
            max_instances: 4,
            ..ClusterConfig::default()
        },
        None,
        0,
    );
    let e = c.scale(0, 0).unwrap_err();
    assert_eq!(e, ControlError::BelowMin { n: 0, min: 1 });
    assert!(e.to_string().contains("minimum is 1"), "{e}");
    let e = c.scale(5, 0).unwrap_err();
    assert_eq!(e, ControlError::AboveMax { n: 5, max: 4 });
    assert!(e.to_string().contains("5") && e.to_string().contains("maximum is 4"));
    assert_eq!(c.target(), 1);
    c.scale(4, 0).unwrap();
    assert_eq!(c.target(), 4);
}

#[test]
fn scaling_out_starts_the_lowest_free_ids() {
    let mut s = Sim::cluster(3);
    // 2 dies; the replacement starts as 2, fails to come up, and the cluster is scaled to 5.
    let d = (0..4).flat_map(|_| s.step(&[1, 3])).collect::<Vec<_>>();
    assert!(d.contains(&Decision::Failed { id: 2 }) && d.contains(&Decision::Start { id: 2 }));
    s.c.scale(5, s.now).unwrap();
    assert_eq!(
        s.step(&[1, 3]),
        vec![Decision::Start { id: 4 }, Decision::Start { id: 5 }]
    );
}

#[test]
fn scaling_in_drains_the_highest_and_stops_it_once_it_serves_nothing() {
    let mut s = Sim::cluster(3);
    s.c.scale(2, s.now).unwrap();
    let before = s.c.assignment().clone();
    let d = s.step(&[1, 2, 3]);
    assert_eq!(d.len(), 1, "{d:?}");
    let a = published(&d)[0].clone();
    assert!(a.owned_by(3).is_empty());
    assert_eq!(counts(&a), BTreeMap::from([(1, 8), (2, 8)]));
    assert!(a.member(3).is_some_and(|m| m.live && m.draining));
    for (old, new) in before.slots.iter().zip(&a.slots) {
        assert_eq!(old.owner == Some(3), old != new);
    }
    assert_eq!(state_of(&s.c, 3, s.now), Some(MemberState::Draining));
    assert_eq!(s.c.target(), 2);

    // Still serving its old partitions, or done but under an older assignment: not yet.
    let mut r = s.report(3);
    r.partitions = before.owned_by(3);
    s.c.on_report(&r, s.now);
    assert!(s.c.tick(s.now).is_empty());
    let mut r = s.report(3);
    r.partitions.clear();
    r.assignment_version = before.version;
    s.c.on_report(&r, s.now);
    assert!(s.c.tick(s.now).is_empty());

    let d = s.step(&[1, 2, 3]);
    assert_eq!(d.len(), 2, "{d:?}");
    let gone = published(&d)[0];
    assert_eq!(gone.member(3), None);
    assert_eq!(owners(gone), owners(&a), "forgetting it moves nothing");
    assert_eq!(d[1], Decision::Stop { id: 3 });
    assert_eq!(state_of(&s.c, 3, s.now), None);
    // Its process reports once more while it exits: not a join.
    assert!(
        s.step(&[1, 2, 3]).is_empty(),
        "no replacement, no rejoin: the target is 2"
    );
    assert_eq!((s.c.target(), state_of(&s.c, 3, s.now)), (2, None));
    // Another process under that id (someone else started it) is a join.
    let mut r = s.report(3);
    r.pid += 1;
    s.c.on_report(&r, s.now);
    assert_eq!(s.c.target(), 3);
    assert_eq!(counts(published(&s.step(&[1, 2, 3]))[0]).len(), 3);
}

#[test]
fn drain_moves_everything_away_lowers_the_target_and_refuses_the_last_instance() {
    let mut s = Sim::cluster(2);
    assert_eq!(s.c.drain(9, s.now), Err(ControlError::Unknown(9)));
    s.c.drain(1, s.now).unwrap();
    assert_eq!(s.c.drain(1, s.now), Ok(()), "draining again does nothing");
    assert_eq!(s.c.target(), 1);
    let e = s.c.drain(2, s.now).unwrap_err();
    assert_eq!(e, ControlError::LastInstance(2));
    assert!(e.to_string().contains("instance 2"));
    let d = s.step(&[1, 2]);
    assert_eq!(d.len(), 1);
    assert_eq!(counts(published(&d)[0]), BTreeMap::from([(2, 16)]));
    // Its reports in that step carried the older version; the next ones the newer.
    let d = s.step(&[1, 2]);
    assert_eq!(d[1], Decision::Stop { id: 1 });

    // A starting instance cannot be drained; at the minimum, a drain starts a replacement.
    let mut s = Sim::new(ClusterConfig {
        min_instances: 2,
        ..ClusterConfig::default()
    });
    s.c.tick(0);
    s.step(&[1]);
    assert_eq!(
        s.c.drain(2, s.now),
        Err(ControlError::NotLive {
            id: 2,
            state: MemberState::Starting
        })
    );
    s.step(&[1, 2]);
    s.c.drain(1, s.now).unwrap();
    assert_eq!(s.c.target(), 2);
    let d = s.step(&[1, 2]);
    assert_eq!(d.last(), Some(&Decision::Start { id: 3 }));
}

#[test]
fn scaling_in_stops_instances_not_started_yet_first() {
    let mut s = Sim::cluster(1);
    s.c.scale(3, s.now).unwrap();
    assert_eq!(
        s.step(&[1]),
        vec![Decision::Start { id: 2 }, Decision::Start { id: 3 }]
    );
    s.c.scale(2, s.now).unwrap();
    assert_eq!(s.step(&[1]), vec![Decision::Stop { id: 3 }]);
    assert_eq!(state_of(&s.c, 1, s.now), Some(MemberState::Live));
    // It had started after all: its reports are ignored until 3 is started again.
    assert!(s
        .step(&[1, 2, 3])
        .iter()
        .all(|d| matches!(d, Decision::Publish(_))));
    assert_eq!((s.c.target(), state_of(&s.c, 3, s.now)), (2, None));
    s.c.scale(3, s.now).unwrap();
    assert_eq!(s.step(&[1, 2]), vec![Decision::Start { id: 3 }]);
    s.step(&[1, 2, 3]);
    assert_eq!(state_of(&s.c, 3, s.now), Some(MemberState::Live));
}

#[test]
fn auto_scale_acts_after_consecutive_intervals_and_resets_its_streak() {
    let mut s = Sim::new(ClusterConfig {
        auto_scale: true,
        ..ClusterConfig::default()
    });
    s.c.tick(0);
    s.step(&[1]);
    s.load = 0.9;
    for _ in 0..4 {
        assert!(s.step(&[1]).is_empty());
    }
    assert_eq!(s.step(&[1]), vec![Decision::Start { id: 2 }]);
    assert_eq!(s.c.target(), 2);
    // While 2 is starting the streak holds at zero, however long it takes.
    for _ in 0..20 {
        assert!(s.step(&[1]).is_empty());
    }
    s.load = 0.5;
    s.step(&[1, 2]);
    // A mean in between resets the streak.
    s.load = 0.1;
    for _ in 0..4 {
        assert!(s.step(&[1, 2]).is_empty());
    }
    s.load = 0.5;
    assert!(s.step(&[1, 2]).is_empty());
    s.load = 0.1;
    for _ in 0..4 {
        assert!(s.step(&[1, 2]).is_empty());
    }
    let d = s.step(&[1, 2]);
    assert_eq!(s.c.target(), 1);
    assert!(published(&d)[0].member(2).is_some_and(|m| m.draining));
    // Ticks faster than the interval count one interval each interval.
    let mut s = Sim::new(ClusterConfig {
        auto_scale: true,
        ..ClusterConfig::default()
    });
    s.load = 0.9;
    s.c.tick(0);
    s.step(&[1]);
    // Evaluated at 1 interval (above: 1); then 4 more intervals in 20 ticks.
    for k in 1..=20 {
        s.now += I / 5;
        s.send(1);
        let d = s.c.tick(s.now);
        if k < 20 {
            assert!(d.is_empty(), "tick {k}");
        } else {
            assert_eq!(d, vec![Decision::Start { id: 2 }]);
        }
    }
}

#[test]
fn a_dead_instance_that_reports_again_is_a_new_member() {
    let mut s = Sim::cluster(2);
    let d: Vec<Decision> = (0..4).flat_map(|_| s.step(&[1])).collect();
    assert_eq!(d[0], Decision::Failed { id: 2 });
    let failed_over = published(&d)[0].clone();
    assert_eq!(counts(&failed_over), BTreeMap::from([(1, 16)]));
    // The old process was only slow: its next report joins it again.
    let d = s.step(&[1, 2]);
    let a = published(&d)[0];
    assert_eq!(counts(a), BTreeMap::from([(1, 8), (2, 8)]));
    for (old, new) in failed_over.slots.iter().zip(&a.slots) {
        if new.owner == Some(2) {
            assert_eq!(new.epoch, old.epoch + 1, "a new ownership, not the old one");
        }
    }
    assert_eq!(d.len(), 1, "it took the replacement's place: {d:?}");
    assert_eq!(s.c.target(), 2);
}

#[test]
fn when_the_last_instance_dies_no_one_owns_until_one_joins() {
    let mut s = Sim::cluster(1);
    let d: Vec<Decision> = (0..4).flat_map(|_| s.step(&[])).collect();
    assert_eq!(d[0], Decision::Failed { id: 1 });
    let a = published(&d)[0].clone();
    assert!(a.slots.iter().all(|s| s.owner.is_none() && s.epoch == 2));
    assert_eq!(d[2], Decision::Start { id: 1 });
    let d = s.step(&[1]);
    assert!(published(&d)[0]
        .slots
        .iter()
        .all(|s| s.owner == Some(1) && s.epoch == 3));
}

#[test]
fn a_restarted_controller_resumes_without_publishing() {
    let mut s = Sim::cluster(3);
    s.c.scale(4, s.now).unwrap();
    s.step(&[1, 2, 3]);
    s.step(&[1, 2, 3, 4]);
    s.c.drain(2, s.now).unwrap();
    s.step(&[1, 2, 3, 4]);
    // The assignment as the store holds it.
    let stored = Assignment::decode(&s.c.assignment().encode()).unwrap();
    assert_eq!(&stored, s.c.assignment());
    s.c = Controller::new(ClusterConfig::default(), Some(stored.clone()), s.now);
    assert_eq!(
        s.c.target(),
        3,
        "live members, the draining one not counted"
    );
    assert_eq!(state_of(&s.c, 2, s.now), Some(MemberState::Draining));
    for _ in 0..100 {
        let mut r = s.report(2);
        r.partitions = vec![0]; // still handing over
        s.c.on_report(&r, s.now);
        assert!(s.step(&[1, 3, 4]).is_empty());
    }
    assert_eq!(s.c.assignment(), &stored);
    // Its drain completes; then a real change publishes the next version.
    let d = s.step(&[1, 2, 3, 4]);
    assert_eq!(d[1], Decision::Stop { id: 2 });
    assert_eq!(published(&d)[0].version, stored.version + 1);
}

#[test]
fn a_restarted_controller_gives_silent_members_the_full_deadline() {
    let mut s = Sim::cluster(3);
    s.now += 10 * I;
    let restart = s.now;
    s.c = Controller::new(
        ClusterConfig::default(),
        Some(s.c.assignment().clone()),
        restart,
    );
    assert!(s.c.tick(restart + DEADLINE).is_empty());
    s.now = restart + DEADLINE + 1;
    s.send(1);
    let d = s.c.tick(s.now);
    assert_eq!(
        d[..2],
        [Decision::Failed { id: 2 }, Decision::Failed { id: 3 }]
    );
    assert_eq!(counts(published(&d)[0]), BTreeMap::from([(1, 16)]));
    assert_eq!(
        d[3..],
        [Decision::Start { id: 2 }, Decision::Start { id: 3 }]
    );
}

#[test]
fn stale_reports_are_ignored() {
    let mut s = Sim::cluster(2);
    s.c.drain(2, s.now).unwrap();
    s.step(&[1, 2]);
    let v = s.c.assignment().version;
    let mut done = s.report(2);
    done.partitions.clear();
    done.assignment_version = v;
    done.addr = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 1);
    let mut newer = s.report(2);
    newer.partitions = vec![3];
    s.c.on_report(&newer, s.now);
    s.c.on_report(&done, s.now); // older seq: arrived late
    assert!(s.c.tick(s.now).is_empty());
    done.seq = newer.seq; // a duplicate seq
    s.c.on_report(&done, s.now);
    assert!(s.c.tick(s.now).is_empty());
    assert_eq!(
        s.c.status(s.now)
            .iter()
            .find(|m| m.id == 2)
            .and_then(|m| m.addr),
        Some(addr(2))
    );
    done.seq = newer.seq + 1;
    s.c.on_report(&done, s.now);
    let d = s.c.tick(s.now);
    assert_eq!(d.last(), Some(&Decision::Stop { id: 2 }));
}

#[test]
fn status_shows_the_last_report() {
    let mut s = Sim::cluster(2);
    s.now += 7;
    let st = s.c.status(s.now);
    assert_eq!(st.len(), 2);
    let m = &st[1];
    assert_eq!((m.id, m.pid, m.state), (2, 1002, MemberState::Live));
    assert_eq!(m.addr, Some(addr(2)));
    assert_eq!((m.packets, m.drops, m.entries), (10, 1, 5));
    assert_eq!(m.partitions, s.c.assignment().owned_by(2));
    assert_eq!(m.last_heard_ns_ago, Some(7));
    assert!((m.load - 0.5).abs() < 1e-12);
}

// ---- properties ----

#[derive(Debug, Clone)]
enum Op {
    /// Instance `id` reports: serving its partitions (`follow`) or nothing; `stale` replays its
    /// last sequence number.
    Report {
        id: InstanceId,
        follow: bool,
        stale: bool,
        load: f64,
    },
    Wait(Nanos),
    Tick,
    Scale(u32),
    Drain(InstanceId),
    /// The controller restarts from its assignment (as stored).
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u32..=6, any::<bool>(), prop::bool::weighted(0.1), 0.0..=1.0f64).prop_map(
            |(id, follow, stale, load)| Op::Report { id, follow, stale, load }
        ),
        2 => prop_oneof![Just(I / 2), Just(I), Just(4 * I), Just(START_TIMEOUT + 1)]
            .prop_map(Op::Wait),
        4 => Just(Op::Tick),
        1 => (0u32..=6).prop_map(Op::Scale),
        1 => (0u32..=6).prop_map(Op::Drain),
        1 => Just(Op::Restart),
    ]
}

fn states(c: &Controller, now: Nanos) -> BTreeMap<InstanceId, MemberState> {
    c.status(now).iter().map(|m| (m.id, m.state)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_assignment_stays_safe_under_any_sequence_of_events(
        partitions in 0u32..=9,
        auto_scale in any::<bool>(),
        standby in 0u32..=2,
        ops in prop::collection::vec(op(), 1..150),
    ) {
        let config = ClusterConfig {
            partitions,
            auto_scale,
            standby,
            max_instances: 5,
            scale_periods: 2,
            ..ClusterConfig::default()
        };
        let mut c = Controller::new(config.clone(), None, 0);
        let mut now = 0;
        let mut seq: BTreeMap<InstanceId, u64> = BTreeMap::new();
        let mut last = c.assignment().clone();
        for op in ops {
            match op {
                Op::Report { id, follow, stale, load } => {
                    let s = seq.entry(id).or_default();
                    if !stale {
                        *s += 1;
                    }
                    let a = c.assignment();
                    let r = Report {
                        stage: 0,
                        id,
                        addr: addr(id),
                        pid: id,
                        seq: *s,
                        load,
                        partitions: if follow { a.owned_by(id) } else { vec![] },
                        packets: 0,
                        drops: 0,
                        entries: 0,
                        assignment_version: a.version,
                        store_trouble: 0,
                    };
                    c.on_report(&r, now);
                }
                Op::Wait(d) => now += d,
                Op::Scale(n) => {
                    let _ = c.scale(n, now);
                }
                Op::Drain(id) => {
                    let _ = c.drain(id, now);
                }
                Op::Restart => c = Controller::new(config.clone(), Some(last.clone()), now),
                Op::Tick => {
                    let before = states(&c, now);
                    let d = c.tick(now);
                    let after = states(&c, now);
                    let a = c.assignment().clone();
                    // Decisions come in kind order: Failed, Publish, Stop, Start.
                    let rank = |d: &Decision| match d {
                        Decision::Failed { .. } | Decision::Straggler { .. } => 0,
                        Decision::Publish(_) => 1,
                        Decision::Stop { .. } => 2,
                        Decision::Start { .. } => 3,
                    };
                    prop_assert!(d.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])), "{:?}", d);
                    let p = published(&d);
                    prop_assert!(p.len() <= 1);
                    if let Some(p) = p.first() {
                        prop_assert_eq!(*p, &a);
                        prop_assert!(a.version > last.version);
                        prop_assert_eq!(Assignment::decode(&a.encode()), Ok(a.clone()));
                    } else {
                        prop_assert_eq!(&a, &last);
                    }
                    prop_assert_eq!(a.slots.len(), last.slots.len());
                    for (old, new) in last.slots.iter().zip(&a.slots) {
                        let bump = if old.owner == new.owner { 0 } else { 1 };
                        prop_assert_eq!(new.epoch, old.epoch + bump);
                    }
                    let serving = |s: Option<&MemberState>| {
                        matches!(s, Some(MemberState::Live | MemberState::Draining))
                    };
                    let anyone = after.values().any(|s| serving(Some(s)));
                    let live = after.values().any(|s| *s == MemberState::Live);
                    for slot in &a.slots {
                        match slot.owner {
                            Some(id) => {
                                prop_assert!(serving(after.get(&id)));
                                prop_assert!(!live || after[&id] == MemberState::Live,
                                    "a draining owner while a live instance exists");
                                prop_assert!(a.member(id).is_some_and(|m| m.live));
                            }
                            None => prop_assert!(!anyone),
                        }
                    }
                    // Starting, live and standby instances meet the target and the standbys,
                    // within the bounds.
                    let have = after
                        .values()
                        .filter(|s| matches!(s, MemberState::Starting | MemberState::Live
                            | MemberState::Standby))
                        .count() as u32;
                    prop_assert_eq!(have, c.target() + standby);
                    prop_assert!((1..=5).contains(&c.target()));
                    for x in &d {
                        match x {
                            Decision::Failed { id } | Decision::Straggler { id, .. } => {
                                prop_assert!(matches!(before.get(id),
                                    Some(MemberState::Starting | MemberState::Live
                                        | MemberState::Standby | MemberState::Draining)));
                            }
                            Decision::Stop { id } => {
                                prop_assert!(matches!(before.get(id),
                                    Some(MemberState::Starting | MemberState::Standby
                                        | MemberState::Draining)));
                                prop_assert!(!serving(after.get(id)));
                            }
                            Decision::Start { id } => {
                                prop_assert_eq!(after.get(id), Some(&MemberState::Starting));
                            }
                            Decision::Publish(_) => {}
                        }
                    }
                    last = a;
                }
            }
            // Only a tick publishes.
            prop_assert_eq!(c.assignment(), &last);
        }
    }

    #[test]
    fn decoding_never_panics(b in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Assignment::decode(&b);
        let _ = Report::decode(&b);
        // Also behind a valid header, so the body is exercised.
        for magic in [ASSIGNMENT_MAGIC, REPORT_MAGIC] {
            let mut x = magic.to_vec();
            x.push(FORMAT_VERSION);
            x.extend_from_slice(&b);
            let _ = Assignment::decode(&x);
            let _ = Report::decode(&x);
        }
    }

    #[test]
    fn encodings_round_trip(
        version in any::<u64>(),
        slots in prop::collection::vec((0u32..5, any::<u32>()), 0..20),
        members in prop::collection::vec(
            (1u32.., any::<u32>(), any::<u16>(), any::<bool>(), any::<bool>()), 0..8),
        report in (1u32.., any::<u32>(), any::<u64>(), 0.0..=1.0f64,
            prop::collection::vec(any::<u32>(), 0..20), any::<[u64; 4]>()),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let a = Assignment {
            version,
            term: version / 3,
            stage: version as u32,
            slots: slots
                .into_iter()
                .map(|(o, epoch)| Slot { owner: (o != 0).then_some(o), epoch })
                .collect(),
            members: members
                .into_iter()
                .map(|(id, ip, port, live, draining)| MemberAddr {
                    id,
                    addr: SocketAddrV4::new(Ipv4Addr::from(ip), port),
                    live,
                    draining,
                })
                .collect(),
        };
        let (id, pid, seq, load, partitions, [packets, drops, entries, assignment_version]) =
            report;
        let r = Report {
            stage: seq as u32,
            id,
            addr: addr(id),
            pid,
            seq,
            load,
            partitions,
            packets,
            drops,
            entries,
            assignment_version,
            store_trouble: packets / 3,
        };
        let (ab, rb) = (a.encode(), r.encode());
        prop_assert_eq!(Assignment::decode(&ab), Ok(a));
        prop_assert_eq!(Report::decode(&rb), Ok(r));
        // Corrupted encodings decode to something or fail; they never panic.
        for mut b in [ab, rb] {
            for (i, x) in &flips {
                let n = b.len();
                b[i % n] ^= x | 1;
            }
            let _ = Assignment::decode(&b);
            let _ = Report::decode(&b);
        }
    }
}

#[test]
fn stages_share_one_id_space_and_never_start_each_others_ids() {
    // Stage 0 runs 1 and 2; stage 1's core must start 3 and 4, and a replacement of stage 0's
    // dead instance 1 takes 1 again, never one of stage 1's.
    let s0 = Sim::cluster(2);
    let mut s1 = Controller::new(
        ClusterConfig {
            stage: 1,
            ..ClusterConfig::default()
        },
        None,
        0,
    );
    s1.set_taken(s0.c.ids());
    s1.scale(2, 0).unwrap();
    assert_eq!(
        s1.tick(0),
        vec![Decision::Start { id: 3 }, Decision::Start { id: 4 }]
    );
    assert_eq!(s1.assignment().stage, 1);
    let mut s0 = s0;
    s0.c.set_taken(s1.ids());
    // Instance 1 dies: its replacement is 1 again (its own dead id), not 3.
    s0.now += DEADLINE + I;
    s0.send(2);
    let d = s0.c.tick(s0.now);
    assert!(d.contains(&Decision::Failed { id: 1 }), "{d:?}");
    assert!(d.contains(&Decision::Start { id: 1 }), "{d:?}");
    // Scaling stage 0 out skips the other stage's ids.
    s0.c.scale(3, s0.now).unwrap();
    let d = s0.c.tick(s0.now);
    assert!(d.contains(&Decision::Start { id: 5 }), "{d:?}");
    assert!(published(&d).iter().all(|a| a.stage == 0));
}

#[test]
fn a_report_numbered_far_ahead_of_the_clock_is_refused_not_adopted() {
    let mut s = Sim::cluster(2);
    let skew = ClusterConfig::default().clock_skew;
    let mut far = s.report(2);
    far.seq = s.now + skew + 1;
    far.addr = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 99), 1);
    s.c.on_report(&far, s.now);
    let at = |s: &Sim| {
        s.c.status(s.now)
            .iter()
            .find(|m| m.id == 2)
            .and_then(|m| m.addr)
    };
    assert_eq!(at(&s), Some(addr(2)), "the far report was taken");
    // The real ones still count (none looks old beside it).
    let mut real = s.report(2);
    real.addr = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 42), 1);
    s.c.on_report(&real, s.now);
    assert_eq!(at(&s), real.addr.into());
    // A stranger's id numbered far ahead does not join either.
    let mut stranger = s.report(9);
    stranger.seq = u64::MAX;
    s.c.on_report(&stranger, s.now);
    assert!(s.c.status(s.now).iter().all(|m| m.id != 9));
    // Within the skew: taken.
    let mut near = s.report(2);
    near.seq = s.now + skew;
    near.addr = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 43), 1);
    s.c.on_report(&near, s.now);
    assert_eq!(at(&s), Some(near.addr));
}
