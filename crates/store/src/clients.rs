//! Idempotency state of one shard's clients (CHC §5.3; StatelessNF §4.1 retransmissions): per
//! client id the highest op id applied, and the answers of its last batches, to answer a
//! retransmission as the first time.
//!
//! Client ids are the clients' choice, so the state is bounded two ways
//! ([`crate::Config::max_clients`], [`crate::Config::max_reply_cache`]): past the most clients,
//! the least recently active are forgotten (an eighth at a time, so that the scan that finds
//! them runs once per that many new clients); past the most bytes of kept answers, the oldest
//! answers go first. Recovery (log replay, roll-forward) forgets nothing: a part is applied
//! once only if its client's last op id is known.

use flowstate_proto::Reply;
use std::collections::VecDeque;

/// How many answered batches per client are kept (a driver retransmits only the frames of the
/// call in progress; ack-only batches need no answer kept).
pub(crate) const ANSWERS_PER_CLIENT: usize = 64;

/// One client's state.
struct Client {
    /// Highest op id applied.
    last: u64,
    /// When it was last active (the shard's count of updates to this table).
    used: u64,
    /// Answers of its last batches, by op id, oldest first.
    answers: VecDeque<(u64, Vec<(u32, Reply)>)>,
}

/// The idempotency state of one shard's clients, bounded.
pub(crate) struct Clients {
    map: foldhash::HashMap<u64, Client>,
    /// Answers kept, oldest first (client, op id); an entry whose answer already went (the
    /// client's own limit, or the client forgotten) is skipped when reached.
    order: VecDeque<(u64, u64)>,
    /// Bytes and count of the answers kept.
    bytes: usize,
    kept: usize,
    clock: u64,
    /// Most clients and most bytes of answers (per shard).
    max_clients: usize,
    max_bytes: usize,
}

impl Default for Clients {
    fn default() -> Self {
        Clients {
            map: Default::default(),
            order: VecDeque::new(),
            bytes: 0,
            kept: 0,
            clock: 0,
            max_clients: usize::MAX,
            max_bytes: usize::MAX,
        }
    }
}

/// The bytes an answer holds (as encoded: what it costs to keep, near enough).
fn size(answer: &[(u32, Reply)]) -> usize {
    answer
        .iter()
        .map(|(_, r)| 4 + flowstate_proto::reply_len(r))
        .sum()
}

/// What [`Clients::bound`] let go.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LetGo {
    pub(crate) answers: u64,
    pub(crate) clients: u64,
}

impl Clients {
    /// Bounded to `max_clients` clients and `max_bytes` bytes of answers.
    pub(crate) fn bounded(max_clients: usize, max_bytes: usize) -> Clients {
        Clients {
            max_clients: max_clients.max(1),
            max_bytes,
            ..Default::default()
        }
    }

    /// Clients known.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes of answers kept.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Each client and its highest op id applied.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(c, d)| (*c, d.last))
    }

    /// The highest op id applied of `client`, if known.
    pub(crate) fn last(&self, client: u64) -> Option<u64> {
        self.map.get(&client).map(|d| d.last)
    }

    /// The answer kept of `client`'s batch `op_id`.
    pub(crate) fn answer(&self, client: u64, op_id: u64) -> Option<&[(u32, Reply)]> {
        let d = self.map.get(&client)?;
        d.answers
            .iter()
            .find(|(id, _)| *id == op_id)
            .map(|(_, a)| a.as_slice())
    }

    /// `client` applied batch `op_id` (its highest op id is at least that now).
    pub(crate) fn applied(&mut self, client: u64, op_id: u64) {
        self.clock += 1;
        let d = self.map.entry(client).or_insert(Client {
            last: 0,
            used: 0,
            answers: VecDeque::new(),
        });
        d.used = self.clock;
        d.last = d.last.max(op_id);
    }

    /// Keeps `answer`, the answer of `client`'s batch `op_id` (applied: [`Clients::applied`]).
    pub(crate) fn keep(&mut self, client: u64, op_id: u64, answer: &[(u32, Reply)]) {
        let Some(d) = self.map.get_mut(&client) else {
            return;
        };
        // The client's oldest answer makes room for this one (and lends its allocation).
        let mut kept = match d.answers.len() >= ANSWERS_PER_CLIENT {
            true => match d.answers.pop_front() {
                Some((_, old)) => {
                    self.bytes -= size(&old);
                    self.kept -= 1;
                    old
                }
                None => Vec::new(),
            },
            false => Vec::new(),
        };
        kept.clear();
        kept.extend_from_slice(answer);
        self.bytes += size(&kept);
        self.kept += 1;
        d.answers.push_back((op_id, kept));
        self.order.push_back((client, op_id));
    }

    /// Lets go of the oldest answers and the least recently active clients beyond the
    /// bounds.
    pub(crate) fn bound(&mut self) -> LetGo {
        let mut gone = LetGo::default();
        while self.bytes > self.max_bytes {
            let Some((client, op_id)) = self.order.pop_front() else {
                break;
            };
            let Some(d) = self.map.get_mut(&client) else {
                continue;
            };
            if let Some(at) = d.answers.iter().position(|(id, _)| *id == op_id) {
                if let Some((_, a)) = d.answers.remove(at) {
                    self.bytes -= size(&a);
                    self.kept -= 1;
                    gone.answers += 1;
                }
            }
        }
        if self.map.len() > self.max_clients {
            let keep = self.max_clients - self.max_clients / 8;
            let mut used: Vec<u64> = self.map.values().map(|d| d.used).collect();
            let forget = used.len() - keep;
            let (_, cut, _) = used.select_nth_unstable(forget - 1);
            let cut = *cut;
            let (bytes, kept) = (&mut self.bytes, &mut self.kept);
            self.map.retain(|_, d| {
                let stays = d.used > cut;
                if !stays {
                    for (_, a) in &d.answers {
                        *bytes -= size(a);
                        *kept -= 1;
                    }
                }
                stays
            });
            gone.clients += forget as u64;
        }
        // Entries of answers already gone: dropped once they outnumber the live ones.
        if self.order.len() > 2 * self.kept + 1024 {
            let map = &self.map;
            self.order.retain(|(c, id)| {
                map.get(c)
                    .is_some_and(|d| d.answers.iter().any(|(i, _)| i == id))
            });
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bytes: usize) -> Vec<(u32, Reply)> {
        vec![(0, Reply::Value(Some(vec![7; bytes])))]
    }

    #[test]
    fn answers_stay_under_their_bytes_oldest_going_first() {
        let mut c = Clients::bounded(usize::MAX, 10_000);
        for op in 1..=100u64 {
            c.applied(op % 7, op);
            c.keep(op % 7, op, &answer(1000));
            c.bound();
            assert!(c.bytes() <= 10_000, "{}", c.bytes());
        }
        // The newest answers are there, the oldest gone; every op id is still known.
        assert!(c.answer(2, 100).is_some());
        assert!(c.answer(1, 1).is_none());
        assert_eq!(c.last(1), Some(99));
        assert!(c.order.len() <= 2 * c.kept + 1024);
    }

    #[test]
    fn the_least_recently_active_clients_are_forgotten_beyond_the_most() {
        let mut c = Clients::bounded(800, usize::MAX);
        // Client 0 stays active; 10,000 others come once each.
        let mut forgotten = 0;
        for id in 1..=10_000u64 {
            c.applied(0, id);
            c.applied(id, 1);
            c.keep(id, 1, &answer(10));
            forgotten += c.bound().clients;
            assert!(c.len() <= 800);
        }
        assert_eq!(c.last(0), Some(10_000));
        assert_eq!(c.last(10_000), Some(1));
        assert_eq!(c.last(1), None);
        assert_eq!(forgotten, 10_001 - c.len() as u64);
        assert_eq!(c.bytes(), c.kept * size(&answer(10)));
    }
}
