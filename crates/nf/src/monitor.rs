//! The flow monitor: per-flow packets and bytes, kept while the flow is active (an idle
//! timeout per entry, FlexState §VI-B timers), with totals of finished flows.
//!
//! ```toml
//! [[chain]]
//! nf = "monitor"
//! idle_timeout = "60s"   # time without a packet after which a flow counts as finished
//! max_flows = 262144     # flows kept at most, shared by the workers
//! early_drop = true      # at the cap, a new flow ends the oldest flow never answered
//! ```
//!
//! **A full table** (`max_flows`, default 262,144 as conntrack's `nf_conntrack_max`): a new
//! flow ends the oldest flow that was never answered (one side only has sent) with
//! `early_drop = true` (the default, as conntrack's early drop; its packets and bytes go to
//! the finished totals), else, or when no such flow is among the oldest, it is not kept. The
//! monitor only observes, so the packet is forwarded either way. Counted as
//! `flows_early_dropped` and `flows_table_full`; the cap is the gauge `max_flows`.

use crate::early_drop::{self, Cap, Unit};
use crate::{BuildError, Context, NetworkFunction, NfFactory, Packet, Placement, Verdict};
use flowstate_state::{Access, Codec, CodecError, Counter, Declare, Map, Nanos, Scope};
use flowstate_wire::FlowKey;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// `[[chain]] nf = "monitor"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// Time without a packet after which a flow counts as finished (default 60s).
    #[serde(
        default = "default_idle",
        deserialize_with = "flowstate_config::deserialize_duration"
    )]
    pub idle_timeout: Duration,
    /// Flows kept at most, shared evenly by the workers (default 262,144).
    #[serde(default = "early_drop::default_max")]
    pub max_flows: u64,
    /// Whether a new flow at the cap ends the oldest flow never answered (default `true`).
    #[serde(default = "early_drop::default_early_drop")]
    pub early_drop: bool,
}

fn default_idle() -> Duration {
    Duration::from_secs(60)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            idle_timeout: default_idle(),
            max_flows: early_drop::default_max(),
            early_drop: true,
        }
    }
}

/// What the monitor keeps per flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FlowStats {
    /// Packets in both directions.
    pub packets: u64,
    /// Bytes in both directions.
    pub bytes: u64,
    /// First packet, ns.
    pub first_ns: Nanos,
    /// Latest packet, ns.
    pub last_ns: Nanos,
    /// The sides that have sent (bit 0: the canonical source, bit 1: the other); both: the
    /// flow was answered.
    pub sides: u8,
}

impl FlowStats {
    /// Whether the flow may be ended early: it was never answered.
    fn expendable(&self) -> bool {
        self.sides != 3
    }
}

impl Codec for FlowStats {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.packets, self.bytes, self.first_ns, self.last_ns).encode(out);
        self.sides.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (packets, bytes, first_ns, last_ns) = <(u64, u64, u64, u64)>::decode(input)?;
        // Entries written without `sides` count as answered (never ended early).
        let sides = if input.is_empty() {
            3
        } else {
            u8::decode(input)?
        };
        if sides > 3 {
            return Err(CodecError::Invalid("monitor flow sides"));
        }
        Ok(FlowStats {
            packets,
            bytes,
            first_ns,
            last_ns,
            sides,
        })
    }
}

/// Builds monitors.
#[derive(Debug, Clone)]
pub(crate) struct Factory(pub Config);

/// The factory for a `[[chain]]` table.
pub(crate) fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    let config: Config = crate::read_config("monitor", table)?;
    let mut errors = Vec::new();
    crate::positive("monitor", "idle_timeout", config.idle_timeout, &mut errors);
    early_drop::check_max("monitor", "max_flows", config.max_flows, &mut errors);
    BuildError::all(errors)?;
    Ok(Arc::new(Factory(config)))
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        "monitor"
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(Monitor {
            idle: self.0.idle_timeout,
            cap: Cap::declare(
                state,
                Unit::Flows,
                self.0.max_flows,
                self.0.early_drop,
                worker,
            )?,
            flows: state.map("flows", Scope::PerFlow, Access::ReadWrite)?,
            finished: state.counter(
                "finished_flows",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            finished_packets: state.counter(
                "finished_packets",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            finished_bytes: state.counter(
                "finished_bytes",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            state_errors: 0,
        }))
    }
}

/// One worker's monitor.
pub(crate) struct Monitor {
    idle: Duration,
    flows: Map<FlowKey, FlowStats>,
    finished: Counter,
    finished_packets: Counter,
    finished_bytes: Counter,
    state_errors: i64,
    /// The cap of `flows`.
    cap: Cap<FlowKey>,
}

impl NetworkFunction for Monitor {
    fn name(&self) -> &str {
        "monitor"
    }

    #[inline]
    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        let Some(flow) = pkt.dissection.flow else {
            return Verdict::Forward;
        };
        let key = flow.canonical();
        let side = 1u8 << u8::from(!flow.is_canonical());
        let len = pkt.data.len() as u64;
        let updated = self.flows.with_mut(&key, |s| match s {
            Some(s) => {
                s.packets += 1;
                s.bytes += len;
                s.last_ns = cx.now;
                s.sides |= side;
                true
            }
            None => false,
        });
        match updated {
            Ok(true) => {}
            Ok(false) => {
                let Monitor {
                    flows,
                    cap,
                    finished,
                    finished_packets,
                    finished_bytes,
                    ..
                } = self;
                let room = cap.admit(flows.cached_len(), |k| {
                    let Ok(Some(true)) = flows.with(&k, |s| s.map(FlowStats::expendable)) else {
                        return false;
                    };
                    let Some(s) = flows.remove_nowait(&k) else {
                        return false;
                    };
                    finished.add_nowait(1);
                    finished_packets.add_nowait(s.packets as i64);
                    finished_bytes.add_nowait(s.bytes as i64);
                    true
                });
                if !room {
                    return Verdict::Forward;
                }
                flows.insert_nowait(
                    key,
                    FlowStats {
                        packets: 1,
                        bytes: len,
                        first_ns: cx.now,
                        last_ns: cx.now,
                        sides: side,
                    },
                );
                cap.remember(key);
            }
            Err(_) => {
                self.state_errors += 1;
                return Verdict::Forward;
            }
        }
        self.flows.expire_after(&key, self.idle, cx.now);
        Verdict::Forward
    }

    fn on_tick(&mut self, now: Nanos) {
        let (finished, packets, bytes) =
            (&self.finished, &self.finished_packets, &self.finished_bytes);
        self.flows.expire(now, |_, s| {
            finished.add_nowait(1);
            packets.add_nowait(s.packets as i64);
            bytes.add_nowait(s.bytes as i64);
        });
    }

    fn entries(&self) -> u64 {
        self.flows.cached_len() as u64
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let mut out = vec![
            ("active_flows", self.flows.cached_len() as i64),
            ("finished_flows", self.finished.get().unwrap_or(-1)),
            ("state_errors", self.state_errors),
        ];
        self.cap.report(&mut out);
        out
    }

    fn gauges(&self) -> &'static [&'static str] {
        &["active_flows", "max_flows"]
    }
}
