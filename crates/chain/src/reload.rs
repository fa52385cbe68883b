//! A running chain's NF configurations replaced in place (`SIGHUP`, `flowstate reload`): the
//! workers take the new ones between two batches, keeping every table entry.
//!
//! Promises:
//! * A worker looks for a reload with one atomic load per batch; it locks only to take a new
//!   one, once per reload.
//! * A reload reaches every worker within a batch or an idle turn (a live port turns at least
//!   every few milliseconds without traffic).
//! * [`Reload::running`] is what the workers run: the configurations of the chain they were
//!   built from ([`Reload::start`]), each replaced by the last reload that changed it.

use flowstate_nf::steer::Owners;
use flowstate_nf::{NfFactory, ReloadConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The configurations the workers run, those the last reload changed, and how many reloads
/// there were.
#[derive(Default)]
pub struct Reload {
    generation: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By NF in chain order (`None`: an NF without reloadable keys).
    running: Vec<Option<ReloadConfig>>,
    /// What the last reload changed (`None`: unchanged).
    changed: Vec<Option<ReloadConfig>>,
    /// Who owns which traffic under the last reload's configuration.
    owners: Option<Owners>,
}

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reload")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Reload {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the configurations of `chain`, the factories the workers are built from (the
    /// runtime calls it: [`crate::Runtime::with_reload`]).
    pub fn start(&self, chain: &[Arc<dyn NfFactory>]) {
        self.state().running = chain
            .iter()
            .map(|f| {
                f.reload_config(None).unwrap_or_else(|e| {
                    tracing::warn!(nf = f.name(), "cannot be reloaded: {e}");
                    None
                })
            })
            .collect();
    }

    /// The configurations the workers run, by NF in chain order; empty before
    /// [`Reload::start`].
    pub fn running(&self) -> Vec<Option<ReloadConfig>> {
        self.state().running.clone()
    }

    /// Hands `changed` (one per NF of the chain, `None` for an unchanged one) to every worker,
    /// and `chain`, the new configuration's factories, to the dispatcher (which steers by the
    /// partitions they name: [`NfFactory::partition`]).
    pub fn publish(&self, changed: Vec<Option<ReloadConfig>>, chain: &[Arc<dyn NfFactory>]) {
        let mut s = self.state();
        s.owners = Some(Owners::new(chain));
        for (run, new) in s.running.iter_mut().zip(&changed) {
            if new.is_some() {
                run.clone_from(new);
            }
        }
        s.changed = changed;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Reloads published so far.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// What the reload newer than `seen` (which becomes it) changed, if there is one.
    pub(crate) fn newer(&self, seen: &mut u64) -> Option<Vec<Option<ReloadConfig>>> {
        self.since(seen, |s| Some(s.changed.clone()))
    }

    /// The owners of the reload newer than `seen` (which becomes it), if there is one.
    pub(crate) fn owners_newer(&self, seen: &mut u64) -> Option<Owners> {
        self.since(seen, |s| s.owners.clone())
    }

    /// `read` of the state when a reload newer than `seen` came (`seen` becomes it).
    fn since<R>(&self, seen: &mut u64, read: impl FnOnce(&State) -> Option<R>) -> Option<R> {
        let g = self.generation.load(Ordering::Acquire);
        if g == *seen {
            return None;
        }
        *seen = g;
        read(&self.state())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_nf::Direction;
    use flowstate_wire::FlowKey;

    fn nat(forward: &str) -> Vec<Arc<dyn NfFactory>> {
        let text = format!("external = [\"203.0.113.1\"]\nports = \"1000-1999\"\n{forward}");
        vec![flowstate_nf::registry::factory("nat", &text.parse().unwrap()).unwrap()]
    }

    /// The dispatcher steers by the reloaded chain: a newly forwarded port's packets go to the
    /// partition of the inside server, where its own packets go.
    #[test]
    fn a_reload_hands_the_dispatcher_the_new_owners_once() {
        let reload = Reload::default();
        let old = nat("");
        reload.start(&old);
        let mut seen = 0;
        assert!(reload.owners_newer(&mut seen).is_none());
        let new = nat("forward = [{ proto = \"tcp\", external = \"203.0.113.1:1500\", internal = \"10.0.0.2:8080\" }]");
        reload.publish(vec![new[0].reload_config(None).unwrap()], &new);
        let owners = reload.owners_newer(&mut seen).expect("the reload's owners");
        assert!(reload.owners_newer(&mut seen).is_none(), "once");
        let syn = FlowKey::new(
            "198.51.100.7".parse().unwrap(),
            "203.0.113.1".parse().unwrap(),
            40000,
            1500,
            6,
        );
        let reply = FlowKey::new(
            "10.0.0.2".parse().unwrap(),
            "198.51.100.7".parse().unwrap(),
            8080,
            40000,
            6,
        );
        let server = owners.partition(&reply, None, Direction::Outbound, 16);
        assert_eq!(owners.partition(&syn, None, Direction::Inbound, 16), server);
        let before = flowstate_nf::steer::Owners::new(&old);
        assert_ne!(before.partition(&syn, None, Direction::Inbound, 16), server);
    }
}
