//! The firewall's connections on the live stream (`flowstate state events`, like
//! `conntrack -E`): each connection opened, and each ended (timed out, dropped early for room,
//! or replaced by a new one on its tuple), as JSON lines.
//!
//! Promises:
//! * With no reader ([`event_stream::Hub::active`]), nothing is noted: one relaxed load per
//!   connection opened or ended.
//! * While a reader follows, a worker notes its events in a buffer allocated once (at most
//!   [`NOTED_MAX`] between two ticks; more are lost, counted, and the reader is told) and
//!   publishes them at its next tick, never waiting for a reader.

use super::{Conn, NF};
use crate::event_stream;
use crate::Direction;
use flowstate_state::Nanos;
use flowstate_wire::FlowKey;
use std::fmt::Write as _;
use std::net::IpAddr;

/// Events a worker notes between two ticks, at most.
pub(super) const NOTED_MAX: usize = 4096;

/// A worker's events since its last tick.
#[derive(Debug, Default)]
pub(super) struct Stream {
    noted: Vec<Noted>,
    lost: u64,
    /// A line being written (kept: its buffer is reused).
    line: String,
}

/// A connection opened (`why` empty) or ended (`why`: how).
#[derive(Debug, Clone, Copy)]
struct Noted {
    key: FlowKey,
    conn: Conn,
    why: &'static str,
}

impl Stream {
    /// Notes that the connection of canonical key `key` opened (`why` empty) or ended.
    #[inline]
    pub(super) fn note(&mut self, key: &FlowKey, conn: &Conn, why: &'static str) {
        if !event_stream::hub().active() {
            return;
        }
        if self.noted.capacity() == 0 {
            self.noted.reserve_exact(NOTED_MAX);
        }
        if self.noted.len() < NOTED_MAX {
            self.noted.push(Noted {
                key: *key,
                conn: *conn,
                why,
            });
        } else {
            self.lost += 1;
        }
    }

    /// Publishes what was noted, stamped `now`.
    pub(super) fn publish(&mut self, now: Nanos) {
        if self.noted.is_empty() && self.lost == 0 {
            return;
        }
        let hub = event_stream::hub();
        for n in self.noted.drain(..) {
            self.line.clear();
            line(&n, now, &mut self.line);
            hub.publish(NF, &self.line);
        }
        if self.lost > 0 {
            self.line.clear();
            let _ = write!(self.line, "{{\"event\":\"lost\",\"count\":{}}}", self.lost);
            hub.publish(NF, &self.line);
            self.lost = 0;
        }
    }
}

/// `{"time_ms":…,"nf":"firewall","event":"connection-new","proto":"tcp","src":"…","dst":"…",
/// "state":"SYN_SENT","from":"inside"}`, with `"why"` for an end; the opener is `src`.
fn line(n: &Noted, now: Nanos, out: &mut String) {
    let k = &n.key;
    let (src, dst) = if n.conn.opener_is_canonical_src {
        ((k.src, k.src_port), (k.dst, k.dst_port))
    } else {
        ((k.dst, k.dst_port), (k.src, k.src_port))
    };
    let _ = write!(
        out,
        "{{\"time_ms\":{},\"nf\":\"{NF}\",\"event\":\"{}\",\"proto\":\"{}\",\"src\":\"",
        now / 1_000_000,
        if n.why.is_empty() {
            "connection-new"
        } else {
            "connection-destroy"
        },
        crate::listing::proto_name(k.proto).unwrap_or("other"),
    );
    endpoint(out, src);
    out.push_str("\",\"dst\":\"");
    endpoint(out, dst);
    let _ = write!(
        out,
        "\",\"state\":\"{}\",\"from\":\"{}\"",
        n.conn.state.name(),
        match n.conn.opened_from {
            Direction::Outbound => "inside",
            Direction::Inbound => "outside",
        },
    );
    if !n.why.is_empty() {
        let _ = write!(out, ",\"why\":\"{}\"", n.why);
    }
    out.push('}');
}

/// `address:port`, `[address]:port` for IPv6.
fn endpoint(out: &mut String, (ip, port): (IpAddr, u16)) {
    let _ = match ip {
        IpAddr::V4(a) => write!(out, "{a}:{port}"),
        IpAddr::V6(a) => write!(out, "[{a}]:{port}"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::ConnState;

    #[test]
    fn lines_name_the_opener_first_and_how_a_connection_ended() {
        let key = FlowKey::new(
            "198.51.100.2".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            80,
            40000,
            6,
        );
        let conn = Conn {
            state: ConnState::Established,
            opener_is_canonical_src: false,
            opened_from: Direction::Outbound,
            first_fin_by_opener: None,
        };
        let mut out = String::new();
        line(
            &Noted {
                key,
                conn,
                why: "expired",
            },
            2_000_000,
            &mut out,
        );
        assert_eq!(
            out,
            "{\"time_ms\":2,\"nf\":\"firewall\",\"event\":\"connection-destroy\",\"proto\":\"tcp\",\
             \"src\":\"10.0.0.2:40000\",\"dst\":\"198.51.100.2:80\",\"state\":\"ESTABLISHED\",\
             \"from\":\"inside\",\"why\":\"expired\"}"
        );
    }
}
