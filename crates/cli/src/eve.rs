//! `flowstate run --eve FILE`: the NFs' alerts ([`flowstate_nf::ALERT_TARGET`] events) as EVE
//! JSON lines in a file, as Suricata writes its `eve.json`. A `tracing` layer: the NFs stay
//! sans-IO, and only alert events (rare) take the file's lock.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// Appends each alert's `eve` field to a file, one line each, flushed per alert.
pub(crate) struct EveFile(Mutex<BufWriter<File>>);

impl EveFile {
    /// Opens `path` for appending (created if missing).
    pub(crate) fn open(path: &Path) -> std::io::Result<EveFile> {
        let f = File::options().create(true).append(true).open(path)?;
        Ok(EveFile(Mutex::new(BufWriter::new(f))))
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
        let (Some(line), Ok(mut w)) = (eve.0, self.0.lock()) else {
            return;
        };
        if writeln!(w, "{line}").and_then(|()| w.flush()).is_err() {
            // Said once per failing alert on stderr: the run goes on.
            eprintln!("flowstate: the EVE file could not be written");
        }
    }
}
