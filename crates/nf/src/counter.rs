//! The Counter NF of FlexState §V-A4: counts packets and bytes and forwards everything. Two
//! modes reproduce FlexState's "Sync Counter" and "Async Counter" (Fig. 7):
//!
//! * `sync`: every packet updates the counters in the store and waits for the reply;
//! * `async`: every packet updates them with `add_nowait`; the engine sends one coalesced
//!   update per flush interval (FlexState §III-C).
//!
//! Both count one shared object (`nf@Counter@packets`), so the store is involved in both
//! modes whatever the backend; the difference is only waiting.

use crate::{BuildError, Context, NetworkFunction, NfFactory, Packet, Placement, Verdict};
use flowstate_state::{Access, Counter, Declare, Scope};
use serde::Deserialize;
use std::sync::Arc;

/// How the counter talks to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Update and wait, on every packet.
    Sync,
    /// Update without waiting; flushed every interval.
    #[default]
    Async,
}

/// `[[chain]] nf = "counter"` options.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `sync` or `async` (default).
    #[serde(default)]
    pub mode: Mode,
}

/// Builds counters.
#[derive(Debug, Clone)]
pub struct Factory(pub Config);

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory(crate::read_config("counter", table)?)))
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        _worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(CounterNf {
            mode: self.0.mode,
            packets: state.counter("packets", Scope::Shared, Access::WriteMostly)?,
            bytes: state.counter("bytes", Scope::Shared, Access::WriteMostly)?,
            seen: 0,
            store_errors: 0,
        }))
    }
}

/// One worker's counter.
pub struct CounterNf {
    mode: Mode,
    packets: Counter,
    bytes: Counter,
    seen: i64,
    store_errors: i64,
}

impl NetworkFunction for CounterNf {
    fn name(&self) -> &str {
        "counter"
    }

    #[inline]
    fn process(&mut self, pkt: &mut Packet<'_>, _cx: &Context) -> Verdict {
        self.seen += 1;
        let len = pkt.data.len() as i64;
        match self.mode {
            Mode::Async => {
                self.packets.add_nowait(1);
                self.bytes.add_nowait(len);
            }
            Mode::Sync => {
                // A store that fails is counted; the packet is still forwarded (counting must
                // not stop traffic).
                if self.packets.add(1).is_err() || self.bytes.add(len).is_err() {
                    self.store_errors += 1;
                }
            }
        }
        Verdict::Forward
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        vec![
            ("packets_counted", self.seen),
            ("store_errors", self.store_errors),
        ]
    }
}
