//! flowstate's cluster: NF instances on a shared store, a root that steers each packet to the
//! instance owning its traffic partition, and the controller's process (StatelessNF §3–§4,
//! CHC §4–§5, HashMVT §IV).
//!
//! ```text
//!           controller (membership, failover, scale, drain) <---- reports ----+
//!               | assignment (kept in the store, sent to all)                  |
//! client -- [root: partition -> owner, clock, hold] ==GENEVE==> instance 1..N: the chain
//!                  ^                                                 | state of its partitions
//!                  +<============== output ==========================+--> the shared store
//! ```
//!
//! * [`meta`]: the GENEVE option root and instances exchange frames with.
//! * [`auth`]: the trailer that authenticates every datagram between the roles.
//! * [`steer`]: the root's table and its side of the move protocol (sans-IO).
//! * [`instance`]: an instance's partitions, ownership records, output commit.
//! * [`fast`]: the root's XDP fast path, taught by the instances' output.
//! * [`log`]: the root's packet log: replay after a failure, duplicate suppression.
//! * [`root`], [`serve`], [`controller`]: the three roles' processes.
//! * [`config`]: the `[cluster]` section.
//!
//! Promises: state is partitioned by traffic partition, not by process, so any instance can
//! take any partition over; exactly one instance serves a partition at an epoch (ownership
//! records by compare-and-set, epochs on every packet); a packet leaves an instance only
//! after the state it changed is in the store; moves lose and reorder nothing (see
//! [`steer`]); a failed instance's partitions are claimed by survivors at once, and the root
//! replays to them from its packet log what the failed one left unfinished ([`log`]), which
//! the survivors process once: a packet whose changes were committed is not processed again
//! ([`instance`]).

pub mod auth;
mod config;
mod controller;
mod fast;
mod instance;
pub mod lease;
mod log;
pub mod meta;
mod root;
mod serve;
mod steer;
mod udp;

pub use config::{ClusterSection, StageSection, StoreMode};
pub use controller::{
    assignment_key, request, run_controller, Command, ControllerOptions, Launcher, Status,
};
pub use instance::{Instance, InstanceConfig, InstanceStats};
pub use root::{run_root, take_epoch, RootOptions};
pub use serve::{run_instance, ServeOptions};

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

/// Why a cluster role cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The configuration does not describe a usable cluster.
    #[error("{0}")]
    Config(String),
    /// The store failed.
    #[error("store: {0}")]
    Store(String),
    /// An NF could not be built.
    #[error("building the chain: {0}")]
    Build(String),
    /// A socket or process failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Nanoseconds of the wall clock: the time every role stamps state with, so that a partition's
/// timers mean the same at its next owner (one host, or hosts kept in step by NTP).
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Whether a role's address and interfaces are still there: an error naming the first one
/// gone. A role whose namespace or link was removed under it ends rather than spin on a dead
/// socket.
pub(crate) fn still_here(address: Ipv4Addr, interfaces: &[&str]) -> Result<(), ClusterError> {
    use flowstate_io::afpacket::{address_assigned, interface_exists};
    let gone =
        |what: String| ClusterError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, what));
    if let Some(i) = interfaces.iter().find(|i| !interface_exists(i)) {
        return Err(gone(format!("interface {i} is gone: stopping")));
    }
    if !address.is_unspecified() && address_assigned(address) == Some(false) {
        return Err(gone(format!(
            "address {address} is no longer on any interface of this host: stopping"
        )));
    }
    Ok(())
}

/// A non-blocking UDP socket bound to `addr` with 4 MiB buffers (a burst of a partition's
/// packets must not overflow them).
pub fn udp_socket(addr: SocketAddrV4) -> Result<std::net::UdpSocket, ClusterError> {
    use std::os::fd::AsRawFd;
    let s = std::net::UdpSocket::bind(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot bind {addr}: {e}")))?;
    s.set_nonblocking(true)?;
    let size: libc::c_int = 4 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
        // SAFETY: a valid socket and a c_int option value of the right size. Without the
        // privilege for *FORCE the kernel's default stays (not an error).
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    Ok(s)
}

/// Binds the first of `addrs` this host has (a role listed by address runs where its address
/// is); its index in `addrs` and the socket. `key` names the list in the error.
pub(crate) fn bind_first_own(
    addrs: &[SocketAddrV4],
    key: &str,
) -> Result<(u32, std::net::UdpSocket), ClusterError> {
    for (i, a) in (0u32..).zip(addrs) {
        match udp_socket(*a) {
            Ok(sock) => return Ok((i, sock)),
            Err(ClusterError::Io(e)) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                continue
            }
            Err(e) => return Err(e),
        }
    }
    Err(ClusterError::Config(format!(
        "{key}: none of {:?} is an address of this host",
        addrs.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>()
    )))
}

/// Where a role's counters go as it runs: a file (JSON, replaced atomically) that `flowstate
/// cluster status` reads, and a slot the role's metrics listener reads (no lock: a pointer
/// swap).
#[derive(Debug, Clone, Default)]
pub struct StatsSink {
    /// The file.
    pub file: Option<std::path::PathBuf>,
    /// The slot.
    pub slot: Option<std::sync::Arc<arc_swap::ArcSwapOption<serde_json::Value>>>,
}

impl StatsSink {
    /// Writes `value` to the file and the slot.
    pub fn publish<T: serde::Serialize>(&self, value: &T) {
        if let Some(f) = &self.file {
            write_json(f, value);
        }
        if let Some(slot) = &self.slot {
            match serde_json::to_value(value) {
                Ok(v) => slot.store(Some(std::sync::Arc::new(v))),
                Err(e) => tracing::warn!("cannot publish stats: {e}"),
            }
        }
    }
}

/// Writes `value` as JSON to `path` through a temporary file and a rename, so a reader never
/// sees half of it. Failures are logged, not fatal (stats are for operators).
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) {
    let tmp = path.with_extension("tmp");
    let r = serde_json::to_vec_pretty(value)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        tracing::warn!(path = %path.display(), "cannot write stats: {e}");
    }
}
