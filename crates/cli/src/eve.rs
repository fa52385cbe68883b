//! `flowstate run --eve FILE`: the NFs' alerts ([`flowstate_nf::ALERT_TARGET`] events) as EVE
//! JSON lines in a file, as Suricata writes its `eve.json`. A `tracing` layer: the NFs stay
//! sans-IO, and only alert events take the file's lock.
//!
//! Lines are buffered: a thread writes them out at most [`FLUSH_EVERY`] after they were
//! logged (so `tail -f` sees an alert within that time), and [`EveFile::flush`] writes what is
//! left when the run ends. One `write(2)` per alert cost a quarter of the IPS's time at
//! 10,000 rules.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// The longest an alert waits in the buffer.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// The file and whether it has lines not written out yet.
struct Sink {
    w: BufWriter<File>,
    dirty: bool,
}

/// Appends each alert's `eve` field to a file, one line each (see the module docs).
#[derive(Clone)]
pub(crate) struct EveFile(Arc<Mutex<Sink>>);

impl EveFile {
    /// Opens `path` for appending (created if missing) and starts the flushing thread.
    pub(crate) fn open(path: &Path) -> std::io::Result<EveFile> {
        let f = File::options().create(true).append(true).open(path)?;
        let eve = EveFile(Arc::new(Mutex::new(Sink {
            w: BufWriter::with_capacity(1 << 16, f),
            dirty: false,
        })));
        let weak = Arc::downgrade(&eve.0);
        std::thread::Builder::new()
            .name("eve-flush".into())
            .spawn(move || loop {
                std::thread::sleep(FLUSH_EVERY);
                let Some(sink) = weak.upgrade() else { return };
                EveFile(sink).flush();
            })?;
        Ok(eve)
    }

    /// Writes out the lines buffered since the last flush.
    pub(crate) fn flush(&self) {
        if let Ok(mut s) = self.0.lock() {
            if std::mem::take(&mut s.dirty) && s.w.flush().is_err() {
                eprintln!("flowstate: the EVE file could not be written");
            }
        }
    }
}

/// The `eve` field of an event.
struct EveField(Option<String>);

impl Visit for EveField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "eve" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "eve" {
            // `eve = %json` arrives here; its Debug is the Display text.
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for EveFile {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut eve = EveField(None);
        event.record(&mut eve);
        let (Some(line), Ok(mut s)) = (eve.0, self.0.lock()) else {
            return;
        };
        s.dirty = true;
        if writeln!(s.w, "{line}").is_err() {
            // Said once per failing alert on stderr: the run goes on.
            eprintln!("flowstate: the EVE file could not be written");
        }
    }
}
