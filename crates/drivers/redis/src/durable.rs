//! Durable commits (`wait_replicas = N`): every pipeline that may write ends with `ROLE` and
//! `WAIT k`, where `k` is N, or fewer when the master had fewer replicas connected at the last
//! look; the batch is acknowledged once `k` replicas hold it (see the crate documentation).

use crate::{pipeline, unreachable, Answer};
use flowstate_state::BackendError;
use redis::{Cmd, Connection, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long one `WAIT` may block: replicas on a working link acknowledge in well under a
/// millisecond; a master whose replica just went blocks its caller no longer than this
/// before `ROLE` says so.
const WAIT_STEP: Duration = Duration::from_millis(100);

/// What the backend knows of its masters' replicas.
#[derive(Debug, Clone)]
pub(crate) struct Replication {
    /// `wait_replicas`.
    wanted: u32,
    /// How long a batch may wait for its replicas in all.
    timeout: Duration,
    /// Replicas connected to each master at the last `ROLE`, by address.
    connected: HashMap<String, u32>,
}

impl Replication {
    pub(crate) fn new(wanted: u32, timeout: Duration) -> Replication {
        Replication {
            wanted,
            timeout,
            connected: HashMap::new(),
        }
    }

    /// Whether batches wait for replicas.
    pub(crate) fn on(&self) -> bool {
        self.wanted > 0
    }

    /// The replicas a batch to `addr` waits for.
    fn need(&self, addr: &str) -> u32 {
        self.connected
            .get(addr)
            .map_or(self.wanted, |&c| c.min(self.wanted))
    }

    /// The commands a pipeline to `addr` ends with: `ROLE`, then `WAIT`.
    pub(crate) fn tail(&self, addr: &str) -> [Cmd; 2] {
        [redis::cmd("ROLE"), wait(self.need(addr))]
    }

    /// After a pipeline to `addr` (on `conn`) whose last answers were `role` and `wait`: done
    /// once the replicas it needs hold the batch, asking again (`WAIT` of at most
    /// [`WAIT_STEP`]) while fewer do, up to the timeout.
    pub(crate) fn settle(
        &mut self,
        backend: &'static str,
        addr: &str,
        conn: &mut Connection,
        mut role: Answer,
        mut acked: Answer,
    ) -> Result<(), BackendError> {
        let start = Instant::now();
        loop {
            let before = self.need(addr);
            if let Some(c) = replicas_of(&role) {
                self.connected.insert(addr.to_owned(), c);
            }
            let need = self.need(addr);
            if need < self.wanted && before == self.wanted {
                tracing::warn!(
                    master = addr,
                    connected = need,
                    wait_replicas = self.wanted,
                    "the master has fewer replicas than wait_replicas asks: its commits are \
                     acknowledged with those it has (a failover now can lose them)"
                );
            } else if need == self.wanted && before < self.wanted {
                tracing::info!(master = addr, replicas = need, "commits durable again");
            }
            match acked {
                Answer::Value(Value::Int(n)) if n >= i64::from(need) => return Ok(()),
                Answer::Value(Value::Int(_)) => {}
                other => {
                    return Err(BackendError::Protocol {
                        backend,
                        reason: format!("{addr}: WAIT answered {other:?}"),
                    })
                }
            }
            if start.elapsed() >= self.timeout {
                return Err(unreachable(
                    backend,
                    format!(
                        "{addr}: fewer than {need} replicas acknowledged within {:?} \
                         (wait_replicas): applied on the master, not durable; sent again",
                        self.timeout
                    ),
                ));
            }
            let mut a = pipeline(conn, &[&redis::cmd("ROLE"), &wait(need)])
                .map_err(|e| unreachable(backend, format!("{addr}: {e}")))?;
            (role, acked) = take_tail(&mut a);
        }
    }
}

/// The answers to a pipeline's [`Replication::tail`], taken off its end: (`ROLE`, `WAIT`).
pub(crate) fn take_tail(answers: &mut Vec<Answer>) -> (Answer, Answer) {
    let nil = || Answer::Value(Value::Nil);
    let acked = answers.pop().unwrap_or_else(nil);
    (answers.pop().unwrap_or_else(nil), acked)
}

/// `WAIT replicas` for at most [`WAIT_STEP`].
fn wait(replicas: u32) -> Cmd {
    let mut c = redis::cmd("WAIT");
    c.arg(replicas).arg(WAIT_STEP.as_millis() as u64);
    c
}

/// The replicas a master's `ROLE` answer lists (`None`: not a master's answer).
fn replicas_of(role: &Answer) -> Option<u32> {
    match role {
        Answer::Value(Value::Array(v)) => match (v.first(), v.get(2)) {
            (Some(Value::BulkString(kind)), Some(Value::Array(r))) if kind == b"master" => {
                Some(r.len() as u32)
            }
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(replicas: usize) -> Answer {
        Answer::Value(Value::Array(vec![
            Value::BulkString(b"master".to_vec()),
            Value::Int(100),
            Value::Array(vec![Value::Nil; replicas]),
        ]))
    }

    #[test]
    fn a_master_with_fewer_replicas_is_waited_for_with_those_it_has() {
        let mut r = Replication::new(1, Duration::from_secs(1));
        assert_eq!(r.need("a"), 1, "N until a look says otherwise");
        assert_eq!(replicas_of(&role(0)), Some(0));
        assert_eq!(replicas_of(&Answer::Value(Value::Int(3))), None);
        r.connected.insert("a".into(), 0);
        assert_eq!(r.need("a"), 0);
        r.connected.insert("a".into(), 2);
        assert_eq!(r.need("a"), 1, "never more than wait_replicas");
        assert_eq!(r.need("b"), 1);
    }
}
