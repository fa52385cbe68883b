//! The live stream of an NF's events (`flowstate state events`, like `conntrack -E`): JSON
//! lines that NFs publish off their data path and that readers of a box's telemetry listener
//! subscribe to.
//!
//! Promises:
//! * An NF asks [`Hub::active`] (one relaxed atomic load) before it makes an event for the
//!   stream: with no reader, the stream costs nothing.
//! * [`Hub::publish`] never waits for a reader: each reader has a bounded queue; what does not
//!   fit is lost and counted, and the reader is told how many with a line
//!   `{"event":"lost","count":N}` as soon as its queue has room again.
//! * A reader that goes away is forgotten at the next publish.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Mutex;

/// The readers of one process.
#[derive(Debug)]
pub struct Hub {
    readers: Mutex<Vec<Reader>>,
    count: AtomicUsize,
}

#[derive(Debug)]
struct Reader {
    tx: SyncSender<String>,
    /// Only events of this NF.
    nf: Option<String>,
    /// Events lost since the reader was last told.
    lost: u64,
}

static HUB: Hub = Hub {
    readers: Mutex::new(Vec::new()),
    count: AtomicUsize::new(0),
};

/// This process's hub.
pub fn hub() -> &'static Hub {
    &HUB
}

impl Hub {
    /// Whether anyone reads (NFs make stream events only then).
    #[inline]
    pub fn active(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// A new reader of the events of NF `nf` (all NFs: `None`), holding at most `capacity`
    /// lines it has not taken.
    pub fn subscribe(&self, nf: Option<&str>, capacity: usize) -> Receiver<String> {
        let (tx, rx) = sync_channel(capacity.max(1));
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        readers.push(Reader {
            tx,
            nf: nf.map(str::to_owned),
            lost: 0,
        });
        self.count.store(readers.len(), Ordering::Relaxed);
        rx
    }

    /// Hands `line` (one JSON object, no newline) of NF `nf` to every reader of it.
    pub fn publish(&self, nf: &str, line: &str) {
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        readers.retain_mut(|r| {
            if r.nf.as_deref().is_some_and(|n| n != nf) {
                return true;
            }
            if r.lost > 0 {
                let told = format!("{{\"event\":\"lost\",\"count\":{}}}", r.lost);
                match r.tx.try_send(told) {
                    Ok(()) => r.lost = 0,
                    Err(TrySendError::Full(_)) => {
                        r.lost += 1;
                        return true;
                    }
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            match r.tx.try_send(line.to_owned()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    r.lost += 1;
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
        self.count.store(readers.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_reader_loses_events_is_told_how_many_and_a_gone_one_is_forgotten() {
        let hub = Hub {
            readers: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        };
        assert!(!hub.active());
        let slow = hub.subscribe(Some("nat"), 2);
        let other = hub.subscribe(Some("firewall"), 8);
        assert!(hub.active());
        for i in 0..5 {
            hub.publish("nat", &format!("{{\"n\":{i}}}"));
        }
        // Two fit; three were lost.
        assert_eq!(slow.try_recv().unwrap(), "{\"n\":0}");
        assert_eq!(slow.try_recv().unwrap(), "{\"n\":1}");
        assert!(slow.try_recv().is_err());
        hub.publish("nat", "{\"n\":5}");
        assert_eq!(slow.try_recv().unwrap(), "{\"event\":\"lost\",\"count\":3}");
        assert_eq!(slow.try_recv().unwrap(), "{\"n\":5}");
        // Another NF's reader saw none of it.
        assert!(other.try_recv().is_err());
        drop(slow);
        hub.publish("nat", "{}");
        assert_eq!(hub.readers.lock().unwrap().len(), 1);
        drop(other);
        hub.publish("firewall", "{}");
        assert!(!hub.active());
    }
}
