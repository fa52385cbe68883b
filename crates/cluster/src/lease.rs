//! The controllers' leader: a lease in the store (`cluster@Value@leader`), taken and renewed by
//! compare-and-set and timed on each controller's own monotonic clock, so no two hosts need
//! synchronised clocks, only clocks that run at the same rate (the lease of Chubby, §2.8).
//!
//! * The record: magic "FSLD" | term u64 | holder u32 (its index in `[cluster] controller`) |
//!   ipv4 [4] | renewal u64, big-endian. Every renewal writes a new value (renewal + 1).
//! * A standby reads the record every `lease / 8`. Once one value has stood for a whole `lease`
//!   since the standby first saw it, its holder has not renewed for that long, and the standby
//!   takes the lease by compare-and-set on that value, with the next term. With no record at
//!   all, the first standby to write one leads.
//! * The leader renews every `lease / 4` and leads until `lease` after it *sent* the last
//!   renewal that succeeded. A standby's clock starts no earlier than that renewal landed, so
//!   two controllers never lead at once. A renewal refused (the record changed) ends the term
//!   at once; one that fails (the store unreachable) ends it when the lease runs out. A leader
//!   whose lease ran out keeps renewing its last value: if that still stands when the store
//!   answers again, nobody took over (taking over changes it), and it leads again at once.
//! * The term is the fencing number: assignments carry it
//!   ([`flowstate_control::cluster::Assignment::term`]) and receivers refuse older terms.
//! * [`Leadership`] runs the lease on a thread of its own with its own store connection, so a
//!   store that is slow or away never stalls the controller's loop (whose reports and lag
//!   measures would go stale meanwhile), and the loop's check of its lease is two atomics.

use flowstate_state::{Backend, Kind, ObjectKey, Op, Reply};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"FSLD";
const LEN: usize = 28;

/// The key of the leader's lease.
pub fn lease_key() -> ObjectKey {
    ObjectKey::shared("cluster", Kind::Value, "leader")
}

/// A lease record: who holds it, in which term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The term, counted from 1.
    pub term: u64,
    /// The holder's index in `[cluster] controller`.
    pub index: u32,
    /// The holder's address.
    pub addr: Ipv4Addr,
    /// Renewals in this term.
    pub renewal: u64,
}

impl Holder {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.term.to_be_bytes());
        b.extend_from_slice(&self.index.to_be_bytes());
        b.extend_from_slice(&self.addr.octets());
        b.extend_from_slice(&self.renewal.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Holder> {
        if b.len() != LEN || &b[..4] != MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or_default());
        Some(Holder {
            term: u64_at(4),
            index: u32::from_be_bytes(b[12..16].try_into().unwrap_or_default()),
            addr: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
            renewal: u64_at(20),
        })
    }
}

/// What a [`Lease::step`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// This controller leads from now on, in `term`.
    Elected {
        /// Its term.
        term: u64,
        /// The holder it took the lease from (none: there was no lease).
        from: Option<Holder>,
    },
    /// This controller no longer leads.
    Deposed {
        /// Why.
        reason: String,
    },
}

enum State {
    Standby {
        /// The record as last read, and when this controller first saw that value.
        seen: Option<(Option<Vec<u8>>, Instant)>,
    },
    Leading {
        holder: Holder,
        /// The record as this controller last wrote it.
        value: Vec<u8>,
        /// The end of the lease: `lease` after the last successful renewal was sent.
        until: Instant,
        /// The lease ran out (the store did not answer): not leading, renewing still.
        lapsed: bool,
    },
}

/// One controller's side of the election.
pub struct Lease {
    index: u32,
    addr: Ipv4Addr,
    lease: Duration,
    state: State,
    next: Instant,
    /// The record as last read or written.
    last: Option<Holder>,
}

impl Lease {
    /// Controller `index` at `addr`, standing by; leases last `lease`.
    pub fn new(index: u32, addr: Ipv4Addr, lease: Duration) -> Lease {
        Lease {
            index,
            addr,
            lease,
            state: State::Standby { seen: None },
            next: Instant::now(),
            last: None,
        }
    }

    /// The term this controller leads in, if it leads at `now`.
    pub fn leading(&self, now: Instant) -> Option<u64> {
        match &self.state {
            State::Leading {
                holder,
                until,
                lapsed: false,
                ..
            } if now < *until => Some(holder.term),
            _ => None,
        }
    }

    /// The holder as last known (this controller's own record when it leads).
    pub fn holder(&self) -> Option<Holder> {
        self.last
    }

    /// Stops leading now (it could not act on its lease): stands by, as a new controller.
    pub fn resign(&mut self) {
        self.state = State::Standby { seen: None };
        self.next = Instant::now();
    }

    /// When the lease (of the term returned) ends, while this controller leads.
    fn lease_end(&self) -> Option<(u64, Instant)> {
        match &self.state {
            State::Leading {
                holder,
                until,
                lapsed: false,
                ..
            } => Some((holder.term, *until)),
            _ => None,
        }
    }

    /// Raises the term this controller leads in to at least `term` (a term some assignment
    /// already carries, after the record was lost); written at the next renewal, now.
    pub fn raise(&mut self, term: u64) {
        if let State::Leading { holder, .. } = &mut self.state {
            if holder.term < term {
                holder.term = term;
                self.next = Instant::now();
            }
        }
    }

    /// Reads, takes or renews the lease when it is time to; what changed.
    pub fn step(&mut self, store: &mut dyn Backend) -> Change {
        let now = Instant::now();
        if let State::Leading { until, lapsed, .. } = &mut self.state {
            if now >= *until && !*lapsed {
                *lapsed = true;
                return Change::Deposed {
                    reason: "the lease ran out: the store did not answer in time".into(),
                };
            }
        }
        if now < self.next {
            return Change::None;
        }
        match &self.state {
            State::Leading { .. } => {
                self.next = now + self.lease / 4;
                self.renew(store, now)
            }
            State::Standby { .. } => {
                self.next = now + (self.lease / 8).max(Duration::from_millis(5));
                self.watch(store)
            }
        }
    }

    fn depose(&mut self, reason: String) -> Change {
        self.state = State::Standby { seen: None };
        self.next = Instant::now();
        Change::Deposed { reason }
    }

    fn renew(&mut self, store: &mut dyn Backend, sent: Instant) -> Change {
        let State::Leading {
            holder,
            value,
            lapsed,
            ..
        } = &self.state
        else {
            return Change::None;
        };
        let was_lapsed = *lapsed;
        let next = Holder {
            renewal: holder.renewal + 1,
            ..*holder
        };
        match cas(store, Some(value.clone()), next.encode()) {
            Ok(true) => {
                self.last = Some(next);
                self.state = State::Leading {
                    holder: next,
                    value: next.encode(),
                    until: sent + self.lease,
                    lapsed: false,
                };
                match was_lapsed {
                    true => Change::Elected {
                        term: next.term,
                        from: Some(next),
                    },
                    false => Change::None,
                }
            }
            Ok(false) if was_lapsed => {
                self.state = State::Standby { seen: None };
                Change::None
            }
            Ok(false) => self.depose("another controller took the lease".into()),
            // Tried again at the next step; the lease runs out meanwhile if the store stays away.
            Err(e) => {
                tracing::debug!("cannot renew the lease: {e}");
                Change::None
            }
        }
    }

    fn watch(&mut self, store: &mut dyn Backend) -> Change {
        let read = match read(store) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!("cannot read the lease: {e}");
                return Change::None;
            }
        };
        let now = Instant::now();
        let record = read.as_deref().and_then(Holder::decode);
        if read.is_some() {
            self.last = record;
        }
        let State::Standby { seen } = &mut self.state else {
            return Change::None;
        };
        let lapsed = match seen {
            Some((v, since)) if *v == read => now.duration_since(*since) >= self.lease,
            _ => {
                *seen = Some((read.clone(), now));
                false
            }
        };
        if read.is_some() && !lapsed {
            return Change::None;
        }
        let mine = Holder {
            term: record.map_or(0, |h| h.term) + 1,
            index: self.index,
            addr: self.addr,
            renewal: 0,
        };
        let sent = Instant::now();
        match cas(store, read, mine.encode()) {
            Ok(true) => {
                self.last = Some(mine);
                self.state = State::Leading {
                    holder: mine,
                    value: mine.encode(),
                    until: sent + self.lease,
                    lapsed: false,
                };
                self.next = sent + self.lease / 4;
                Change::Elected {
                    term: mine.term,
                    from: record,
                }
            }
            // Another standby was first, or the holder renewed: watch again.
            Ok(false) | Err(_) => {
                self.state = State::Standby { seen: None };
                Change::None
            }
        }
    }
}

/// A [`Lease`] stepped on a thread of its own (see the module documentation).
pub struct Leadership {
    shared: Arc<Shared>,
    changes: Receiver<Change>,
    orders: Sender<Order>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the controller's loop asks of the lease's thread.
enum Order {
    Raise(u64),
    Resign,
}

struct Shared {
    epoch: Instant,
    term: AtomicU64,
    /// The end of the lease, ns after `epoch`; 0: not leading.
    until: AtomicU64,
    holder: Mutex<Option<Holder>>,
    /// A resignation is on its way to the thread: not leading, whatever it last published.
    resigning: AtomicBool,
    stop: AtomicBool,
}

impl Leadership {
    /// Runs `lease` against `store` until dropped.
    pub fn start(mut lease: Lease, mut store: Box<dyn Backend>) -> std::io::Result<Leadership> {
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            term: AtomicU64::new(0),
            until: AtomicU64::new(0),
            holder: Mutex::new(None),
            resigning: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let (tx, changes) = std::sync::mpsc::channel();
        let (orders, ordered) = std::sync::mpsc::channel();
        let sh = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("lease".into())
            .spawn(move || {
                while !sh.stop.load(Ordering::Relaxed) {
                    while let Ok(o) = ordered.try_recv() {
                        match o {
                            Order::Raise(t) => lease.raise(t),
                            Order::Resign => {
                                lease.resign();
                                sh.resigning.store(false, Ordering::SeqCst);
                            }
                        }
                    }
                    let change = lease.step(store.as_mut());
                    // The state first, then the change: whoever sees the change sees its state.
                    let (term, until) = lease.lease_end().map_or((0, 0), |(t, u)| {
                        (
                            t,
                            u.saturating_duration_since(sh.epoch).as_nanos().max(1) as u64,
                        )
                    });
                    sh.term.store(term, Ordering::SeqCst);
                    sh.until.store(until, Ordering::SeqCst);
                    if let Ok(mut h) = sh.holder.lock() {
                        *h = lease.holder();
                    }
                    if change != Change::None && tx.send(change).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })?;
        Ok(Leadership {
            shared,
            changes,
            orders,
            thread: Some(thread),
        })
    }

    /// The term this controller leads in, if its lease has not ended.
    pub fn leading(&self) -> Option<u64> {
        if self.shared.resigning.load(Ordering::SeqCst) {
            return None;
        }
        let until = self.shared.until.load(Ordering::SeqCst);
        let now = self.shared.epoch.elapsed().as_nanos() as u64;
        let term = self.shared.term.load(Ordering::SeqCst);
        (until != 0 && now < until).then_some(term)
    }

    /// The next change, if any.
    pub fn change(&self) -> Option<Change> {
        self.changes.try_recv().ok()
    }

    /// As [`Lease::holder`].
    pub fn holder(&self) -> Option<Holder> {
        self.shared.holder.lock().ok().and_then(|h| *h)
    }

    /// As [`Lease::raise`].
    pub fn raise(&self, term: u64) {
        let _ = self.orders.send(Order::Raise(term));
    }

    /// As [`Lease::resign`]; not leading from now on.
    pub fn resign(&self) {
        self.shared.resigning.store(true, Ordering::SeqCst);
        let _ = self.orders.send(Order::Resign);
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read(store: &mut dyn Backend) -> Result<Option<Vec<u8>>, String> {
    let mut replies = Vec::new();
    store
        .execute(&[Op::Get { key: lease_key() }], &mut replies)
        .map_err(|e| e.to_string())?;
    match replies.pop() {
        Some(Reply::Value(v)) => Ok(v),
        other => Err(format!("reading the lease: {other:?}")),
    }
}

fn cas(store: &mut dyn Backend, expected: Option<Vec<u8>>, new: Vec<u8>) -> Result<bool, String> {
    let mut replies = Vec::new();
    store
        .execute(
            &[Op::CompareAndSet {
                key: lease_key(),
                expected,
                new: Some(new),
            }],
            &mut replies,
        )
        .map_err(|e| e.to_string())?;
    match replies.pop() {
        Some(Reply::Bool(b)) => Ok(b),
        other => Err(format!("writing the lease: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::local::LocalStore;
    use flowstate_state::Connector;

    const LEASE: Duration = Duration::from_millis(200);

    fn step_until(l: &mut Lease, store: &mut dyn Backend, d: Duration) -> Vec<Change> {
        let end = Instant::now() + d;
        let mut out = Vec::new();
        while Instant::now() < end {
            match l.step(store) {
                Change::None => {}
                c => out.push(c),
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        out
    }

    #[test]
    fn one_leads_a_standby_takes_over_a_lease_after_the_last_renewal_never_before() {
        let c = LocalStore::new();
        let (mut sa, mut sb) = (c.connect().unwrap(), c.connect().unwrap());
        let mut a = Lease::new(0, Ipv4Addr::new(192, 0, 2, 2), LEASE);
        let mut b = Lease::new(1, Ipv4Addr::new(192, 0, 2, 3), LEASE);
        assert_eq!(
            a.step(sa.as_mut()),
            Change::Elected {
                term: 1,
                from: None
            }
        );
        // Both step for three leases: a renews, b never takes over.
        let end = Instant::now() + 3 * LEASE;
        while Instant::now() < end {
            assert_eq!(a.step(sa.as_mut()), Change::None);
            assert_eq!(b.step(sb.as_mut()), Change::None);
            assert_eq!(
                (a.leading(Instant::now()), b.leading(Instant::now())),
                (Some(1), None)
            );
            std::thread::sleep(Duration::from_millis(3));
        }
        assert_eq!(b.holder().map(|h| (h.term, h.index)), Some((1, 0)));
        // a stops (killed): b leads in term 2, a lease or a little more after a's last renewal.
        let stopped = Instant::now();
        let changes = step_until(&mut b, sb.as_mut(), 3 * LEASE);
        let took = b.holder().unwrap();
        assert_eq!((took.term, took.index), (2, 1), "{changes:?}");
        assert!(
            matches!(changes[..], [Change::Elected { term: 2, from: Some(h) }] if h.index == 0)
        );
        assert!(stopped.elapsed() >= LEASE);
        // a comes back: its lease has run out, and its renewal is refused.
        assert_eq!(a.leading(Instant::now()), None);
        assert!(matches!(a.step(sa.as_mut()), Change::Deposed { .. }));
        assert_eq!(step_until(&mut a, sa.as_mut(), LEASE / 2), vec![]);
        assert_eq!(b.leading(Instant::now()), Some(2));
    }

    #[test]
    fn a_leader_that_loses_the_store_steps_down_when_its_lease_runs_out() {
        struct Away;
        impl Backend for Away {
            fn name(&self) -> &'static str {
                "away"
            }
            fn execute(
                &mut self,
                _: &[Op],
                _: &mut Vec<Reply>,
            ) -> Result<(), flowstate_state::BackendError> {
                Err(flowstate_state::BackendError::Unreachable {
                    backend: "away",
                    reason: "cut".into(),
                })
            }
            fn partitions(
                &mut self,
                _: &str,
                _: Kind,
                _: &str,
            ) -> Result<Vec<ObjectKey>, flowstate_state::BackendError> {
                Ok(Vec::new())
            }
        }
        let c = LocalStore::new();
        let mut a = Lease::new(0, Ipv4Addr::LOCALHOST, LEASE);
        assert!(matches!(
            a.step(c.connect().unwrap().as_mut()),
            Change::Elected { .. }
        ));
        let cut = Instant::now();
        let changes = step_until(&mut a, &mut Away, 2 * LEASE);
        assert!(
            matches!(changes[..], [Change::Deposed { .. }]),
            "{changes:?}"
        );
        assert_eq!(a.leading(cut + LEASE), None);
        // The store back, nobody took over: it leads again in the same term.
        let changes = step_until(&mut a, c.connect().unwrap().as_mut(), LEASE);
        assert!(
            matches!(changes[..], [Change::Elected { term: 1, from: Some(h) }] if h.index == 0),
            "{changes:?}"
        );
        assert_eq!(a.leading(Instant::now()), Some(1));
    }

    #[test]
    fn leadership_on_its_own_thread_leads_and_resigns() {
        let c = LocalStore::new();
        let l = Leadership::start(
            Lease::new(0, Ipv4Addr::LOCALHOST, LEASE),
            c.connect().unwrap(),
        )
        .unwrap();
        let end = Instant::now() + 2 * LEASE;
        let change = loop {
            if let Some(ch) = l.change() {
                break ch;
            }
            assert!(Instant::now() < end, "never elected");
            std::thread::sleep(Duration::from_millis(2));
        };
        assert_eq!(
            change,
            Change::Elected {
                term: 1,
                from: None
            }
        );
        assert_eq!(l.leading(), Some(1));
        assert_eq!(l.holder().map(|h| h.index), Some(0));
        l.resign();
        assert_eq!(l.leading(), None);
    }

    #[test]
    fn a_record_that_is_not_a_lease_is_taken_over_after_a_lease() {
        let c = LocalStore::new();
        let mut s = c.connect().unwrap();
        let mut r = Vec::new();
        s.execute(
            &[Op::Set {
                key: lease_key(),
                value: b"junk".to_vec(),
            }],
            &mut r,
        )
        .unwrap();
        let mut a = Lease::new(0, Ipv4Addr::LOCALHOST, LEASE);
        assert_eq!(a.step(s.as_mut()), Change::None);
        let changes = step_until(&mut a, s.as_mut(), 2 * LEASE);
        assert_eq!(
            changes,
            vec![Change::Elected {
                term: 1,
                from: None
            }]
        );
        assert_eq!(
            Holder::decode(&Holder::encode(&a.holder().unwrap())),
            a.holder()
        );
    }
}
