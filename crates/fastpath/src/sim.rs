//! Running the fast path and the slow path together in one thread, on a virtual clock: the
//! deterministic realization tests use, and a model of where a packet's time goes.

use crate::fast::{Answer, FastPath, Packet, Step};
use crate::full::{Found, FullTables, Outcome, SlowError};
use crate::Mode;

/// The slow path's service of one circulation: answers every pending search of `p` in order
/// and hands each table's finding to `install` (the entries to cache in the fast path).
pub fn serve(
    tables: &mut FullTables,
    p: &mut Packet,
    mut install: impl FnMut(usize, Found),
) -> Result<usize, SlowError> {
    let mut answered = 0;
    for s in p.searches_mut() {
        if s.answer != Answer::Pending {
            continue;
        }
        let t = usize::from(s.table);
        let found = tables.search(t, s.key)?;
        s.answer = found.answer();
        install(t, found);
        answered += 1;
    }
    Ok(answered)
}

/// What one circulation and one pass cost, on the virtual clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// A pass through the fast path.
    pub pass_ns: u64,
    /// One way over the fast↔slow link, fixed part.
    pub link_ns: u64,
    /// One way over the link, per byte.
    pub link_ns_per_byte: f64,
    /// One full-table search on the slow path.
    pub search_ns: u64,
    /// Slow-path threads searching in parallel (lazy-p).
    pub threads: usize,
}

/// What [`Sim::run`] reports for one packet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    /// The verdict.
    pub outcome: Outcome,
    /// Time from entering the fast path to leaving it, on the virtual clock.
    pub latency_ns: u64,
    /// Circulations to the slow path.
    pub circulations: u8,
    /// Bytes to the slow path and back.
    pub link_bytes: u64,
}

/// The fast path and one slow path in one thread.
pub struct Sim {
    /// The fast path.
    pub fast: FastPath,
    /// The slow path's tables.
    pub slow: FullTables,
    /// The cost model.
    pub costs: Costs,
}

impl Sim {
    /// Runs one packet to its verdict.
    pub fn run(&mut self, mut p: Packet) -> Result<Report, SlowError> {
        let c = self.costs;
        let mut ns = 0u64;
        let mut bytes = 0u64;
        loop {
            ns += c.pass_ns;
            match self.fast.pass(&mut p) {
                Step::Done { dropped } => {
                    return Ok(Report {
                        outcome: Outcome {
                            headers: p.headers,
                            dropped,
                        },
                        latency_ns: ns,
                        circulations: p.circulations,
                        link_bytes: bytes,
                    })
                }
                Step::Submit => {
                    let up = p.submit_bytes();
                    let fast = &mut self.fast;
                    let n = serve(&mut self.slow, &mut p, |t, f| fast.install(t, &f))? as u64;
                    let down = p.return_bytes(n as usize);
                    bytes += up + down;
                    let searches = match self.fast.mode() {
                        Mode::LazyParallel => n.div_ceil(c.threads.max(1) as u64),
                        _ => n,
                    };
                    ns += 2 * c.link_ns
                        + ((up + down) as f64 * c.link_ns_per_byte) as u64
                        + searches * c.search_ns;
                }
            }
        }
    }
}
