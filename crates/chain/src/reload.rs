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

    /// Hands `changed` (one per NF of the chain, `None` for an unchanged one) to every worker.
    pub fn publish(&self, changed: Vec<Option<ReloadConfig>>) {
        let mut s = self.state();
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
        let g = self.generation.load(Ordering::Acquire);
        if g == *seen {
            return None;
        }
        let changed = self.state().changed.clone();
        *seen = g;
        Some(changed)
    }
}
