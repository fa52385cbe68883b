//! Packet batches and the sources and sinks that fill and drain them.
//!
//! Promises:
//! * A [`PacketBatch`] owns a fixed set of buffers allocated once; receiving into it and sending
//!   from it never allocates per packet.
//! * Every packet source ([`pcap::PcapReader`], [`synth::Synthetic`], later AF_PACKET and AF_XDP)
//!   implements [`Source`]; every sink implements [`Sink`].
//! * A live port ([`Port`]: [`afpacket::AfPacket`],
//!   [`afxdp::AfXdp`]) receives into a caller's batch without
//!   blocking and sends a batch with one system call; a missing privilege or kernel feature is
//!   an [`Error::Device`] that says what is missing.
//! * A damaged input file is an [`Error`] that names the file and the byte offset; the packets
//!   read before it stay valid.

#[cfg(target_os = "linux")]
pub mod afpacket;
#[cfg(target_os = "linux")]
pub mod afxdp;
pub mod batch;
#[cfg(target_os = "linux")]
pub mod bpf;
pub mod pcap;
pub mod synth;

pub use batch::{PacketBatch, PacketMeta};

use std::path::PathBuf;

/// Errors at the edges of the data path: files, formats and options.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The file's bytes are not what its format allows.
    #[error("{path}: {reason} at byte offset {offset}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Offset of the record or block that is damaged.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A network device or socket failed, or cannot be used here.
    #[error("{device}: {what}: {source}")]
    Device {
        /// The interface (or facility) concerned.
        device: String,
        /// What was being done, and what may be missing.
        what: Box<str>,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// An option is out of its range or contradicts another.
    #[error("invalid option {name}: {reason}")]
    Option {
        /// The option's name as the user wrote it (e.g. `packets`).
        name: &'static str,
        /// What was expected.
        reason: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Something that produces packets: a capture file, a traffic generator, an interface.
pub trait Source {
    /// Clears `batch` and fills it with up to `batch.capacity()` packets. Returns how many were
    /// received; `Ok(0)` means the source is exhausted, unless [`Source::idle_now`] says it
    /// was only idle.
    fn recv(&mut self, batch: &mut PacketBatch) -> Result<usize>;

    /// After a `recv` that returned 0: the time now (ns, on the packets' clock) if the source
    /// was only idle for a while (a live port with no traffic), so that timers can run;
    /// `None` (the default): the source is exhausted.
    fn idle_now(&mut self) -> Option<u64> {
        None
    }

    /// Work done so far, for a progress bar, when it is not the packets received (a generator
    /// that leaves packets out, [`synth::SynthConfig::clients_only`]); `None` (the default):
    /// the packets received are the measure.
    fn progress(&self) -> Option<u64> {
        None
    }
}

/// Something that consumes packets: a capture file, an interface, a counter.
pub trait Sink {
    /// Sends every packet of `batch` (all of them: verdicts are applied before the sink).
    fn send(&mut self, batch: &PacketBatch) -> Result<()>;

    /// Pushes anything buffered out to the file or device.
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

/// One port of a live box: an interface it receives from and sends to.
pub trait Port: Send {
    /// The port's MAC address.
    fn mac(&self) -> [u8; 6];

    /// Appends the frames ready now (up to `batch`'s free room) for which `keep` says yes,
    /// each with `port` in its metadata, without blocking. Returns how many were appended.
    fn recv_ready(
        &mut self,
        batch: &mut PacketBatch,
        port: u16,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<usize>;

    /// Sends `frames`; returns how many the device took (the rest were dropped for lack of
    /// room, and counted by the port).
    fn send(&mut self, frames: &mut dyn Iterator<Item = &[u8]>) -> Result<usize>;

    /// A descriptor that polls readable when frames may be ready (`None`: send-only).
    fn raw_fd(&self) -> Option<std::os::fd::RawFd>;
}
