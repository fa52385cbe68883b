//! The flow monitor: per-flow packets and bytes, kept while the flow is active (an idle
//! timeout per entry, FlexState §VI-B timers), with totals of finished flows.

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
}

fn default_idle() -> Duration {
    Duration::from_secs(60)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            idle_timeout: default_idle(),
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
}

impl Codec for FlowStats {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.packets, self.bytes, self.first_ns, self.last_ns).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (packets, bytes, first_ns, last_ns) = <(u64, u64, u64, u64)>::decode(input)?;
        Ok(FlowStats {
            packets,
            bytes,
            first_ns,
            last_ns,
        })
    }
}

/// Builds monitors.
#[derive(Debug, Clone)]
pub(crate) struct Factory(pub Config);

/// The factory for a `[[chain]]` table.
pub(crate) fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    let config: Config = crate::read_config("monitor", table)?;
    if config.idle_timeout.is_zero() {
        return Err(BuildError::config(
            "monitor",
            "idle_timeout",
            "expected a duration above zero, like \"60s\"",
        ));
    }
    Ok(Arc::new(Factory(config)))
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        "monitor"
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        _worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(Monitor {
            idle: self.0.idle_timeout,
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
        let len = pkt.data.len() as u64;
        let updated = self.flows.with_mut(&key, |s| match s {
            Some(s) => {
                s.packets += 1;
                s.bytes += len;
                s.last_ns = cx.now;
                true
            }
            None => false,
        });
        match updated {
            Ok(true) => {}
            Ok(false) => self.flows.insert_nowait(
                key,
                FlowStats {
                    packets: 1,
                    bytes: len,
                    first_ns: cx.now,
                    last_ns: cx.now,
                },
            ),
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
        vec![
            ("active_flows", self.flows.cached_len() as i64),
            ("finished_flows", self.finished.get().unwrap_or(-1)),
            ("state_errors", self.state_errors),
        ]
    }

    fn gauges(&self) -> &'static [&'static str] {
        &["active_flows"]
    }
}
