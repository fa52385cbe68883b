//! A running chain's NF configurations replaced in place (`SIGHUP`, `flowstate reload`): the
//! workers take the new ones between two batches, keeping every table entry.
//!
//! Promises:
//! * A worker looks for a reload with one atomic load per batch; it locks only to take a new
//!   one, once per reload.
//! * A reload reaches every worker within a batch or an idle turn (a live port turns at least
//!   every few milliseconds without traffic).

use flowstate_nf::ReloadConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The configurations reloaded last, by NF in chain order (`None`: unchanged), and how many
/// reloads there were.
#[derive(Default)]
pub struct Reload {
    generation: AtomicU64,
    configs: Mutex<Vec<Option<ReloadConfig>>>,
}

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reload")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Reload {
    /// Hands `configs` (one per NF of the chain, `None` for an unchanged one) to every worker.
    pub fn publish(&self, configs: Vec<Option<ReloadConfig>>) {
        *self.configs.lock().unwrap_or_else(|e| e.into_inner()) = configs;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Reloads published so far.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The configurations of a reload newer than `seen` (which becomes it), if there is one.
    pub(crate) fn newer(&self, seen: &mut u64) -> Option<Vec<Option<ReloadConfig>>> {
        let g = self.generation.load(Ordering::Acquire);
        if g == *seen {
            return None;
        }
        let configs = self
            .configs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        *seen = g;
        Some(configs)
    }
}
