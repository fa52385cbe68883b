//! Lock leases (FlexState §VI-B "LOCKS"), kept beside the objects: a lease named like an
//! object neither sees nor changes it.

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

/// Who holds a lease, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The holder.
    pub owner: u64,
    /// The lease ends by itself then, so a crashed holder cannot block others.
    pub until: Duration,
}

/// The leases of a store (or of one of its shards), by name.
#[derive(Debug)]
pub struct Leases<K> {
    held: foldhash::HashMap<K, Lease>,
}

impl<K> Default for Leases<K> {
    fn default() -> Self {
        Leases {
            held: foldhash::HashMap::default(),
        }
    }
}

impl<K: Hash + Eq> Leases<K> {
    /// Grants `owner` the lease `key` until `now + lease`, unless someone else holds it; the
    /// holder itself is granted it again (renewed). Whether granted. `owned` makes the name
    /// to keep when the lease is new.
    pub fn lock<Q>(
        &mut self,
        key: &Q,
        owned: impl FnOnce() -> K,
        owner: u64,
        lease: Duration,
        now: Duration,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let until = now.saturating_add(lease);
        match self.held.get_mut(key) {
            Some(l) if l.until > now && l.owner != owner => false,
            Some(l) => {
                *l = Lease { owner, until };
                true
            }
            None => {
                self.held.insert(owned(), Lease { owner, until });
                true
            }
        }
    }

    /// Releases `key` if `owner` holds it; whether it did. An expired lease goes too.
    pub fn unlock<Q>(&mut self, key: &Q, owner: u64, now: Duration) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(l) = self.held.get(key) else {
            return false;
        };
        let held = l.until > now && l.owner == owner;
        if held || l.until <= now {
            self.held.remove(key);
        }
        held
    }

    /// Leases held at `now`.
    pub fn held(&self, now: Duration) -> usize {
        self.held.values().filter(|l| l.until > now).count()
    }

    /// Drops the leases that ended by `now`.
    pub fn purge(&mut self, now: Duration) {
        if !self.held.is_empty() {
            self.held.retain(|_, l| l.until > now);
        }
    }

    /// Every lease kept (ended ones until purged).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &Lease)> {
        self.held.iter()
    }

    /// Keeps `lease` under `key` as it is (a lease read back from a checkpoint).
    pub fn restore(&mut self, key: K, lease: Lease) {
        self.held.insert(key, lease);
    }

    /// Leases kept (ended ones until purged).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no lease is kept.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}
