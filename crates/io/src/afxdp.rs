//! AF_XDP ports: an XDP socket per interface queue, its UMEM allocated once and its frames
//! reused, with the XDP program that redirects the queue's frames to it.
//!
//! The redirect program is C (`crates/io/bpf/redirect.bpf.c`: `bpf_redirect_map(&xsks,
//! ctx->rx_queue_index, XDP_PASS)`), compiled by the build script and loaded with [`aya`],
//! which parses the object, creates its map, relocates, verifies and attaches it; the
//! fast-path program ([`crate::fastpath`]) is loaded the same way. The socket, its UMEM and its
//! four rings are set up with `setsockopt`/`mmap` as `Documentation/networking/af_xdp.rst`
//! describes. A build made without clang has no XDP programs: attaching one is an error that
//! says so.
//!
//! Promises:
//! * [`XdpProgram::attach`] attaches the redirect program through a BPF link in generic (SKB)
//!   mode, which every driver supports, veth included; the link, and with it the program, goes
//!   away when the [`XdpProgram`] is dropped (or the process dies). Frames of a queue with no
//!   socket, and frames when no socket is registered, go on to the kernel stack (`XDP_PASS`).
//! * [`AfXdp`] copies each received frame once from its UMEM frame into the caller's batch and
//!   hands the frame straight back to the fill ring; sending copies into a free UMEM frame and
//!   reclaims frames from the completion ring. No allocation after `open`.
//! * Missing privileges (CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW) or kernel support (AF_XDP needs
//!   Linux 5.4+ with `CONFIG_XDP_SOCKETS`, BPF links 5.9+) are errors that say so.
//!
//! Limits: copy mode only (generic XDP has no zero copy); one queue per socket.

use crate::afpacket::interface_info;
use crate::bpf;
use crate::{Error, PacketBatch, PacketMeta, Port, Result};
use aya::maps::{MapData, XskMap};
use aya::programs::xdp::XdpLink;
use aya::programs::{ProgramError, XdpMode};
use aya::Ebpf;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
const XDP_COPY: u16 = 1 << 1;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_RING_NEED_WAKEUP: u32 = 1;

/// The frame size of the UMEM.
pub const FRAME_SIZE: u32 = 2048;

pub(crate) fn dev_err(device: &str, what: &str, e: io::Error) -> Error {
    device_error(device, what, e.raw_os_error(), e)
}

/// A device error whose system error number is `code` (with a hint of what may be missing).
pub(crate) fn device_error(device: &str, what: &str, code: Option<i32>, e: io::Error) -> Error {
    let hint = match code {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (needs CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW: run as root)"
        }
        Some(libc::EAFNOSUPPORT) => " (the kernel lacks AF_XDP: CONFIG_XDP_SOCKETS, Linux 5.4+)",
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            " (another XDP program or socket already uses this interface or queue)"
        }
        Some(libc::EINVAL) if what.contains("link") => {
            " (the kernel lacks BPF links for XDP: Linux 5.9+)"
        }
        Some(libc::ENODEV) => " (no such interface in this network namespace)",
        _ => "",
    };
    Error::Device {
        device: device.to_owned(),
        what: format!("{what}{hint}").into(),
        source: e,
    }
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The slots of an XSKMAP that belong to one port: its queue `q`'s socket goes in slot
/// `first + q`, for `q < count`.
#[derive(Clone)]
pub(crate) struct Sockets {
    pub(crate) map: Arc<Mutex<XskMap<MapData>>>,
    pub(crate) first: u32,
    pub(crate) count: u32,
}

impl std::fmt::Debug for Sockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sockets")
            .field("first", &self.first)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// An XDP program attached to one interface (the redirect program, or a fast path's), and
/// where the sockets of the interface's queues go.
#[derive(Debug)]
pub struct XdpProgram {
    ifname: String,
    ifindex: u32,
    sockets: Sockets,
    _link: XdpLink,
}

impl XdpProgram {
    /// Loads the redirect program with room for `queues` sockets and attaches it to
    /// `ifname` in generic mode.
    pub fn attach(ifname: &str, queues: u32) -> Result<Arc<XdpProgram>> {
        let queues = queues.max(1);
        let what = "loading the XDP redirect program";
        let mut ebpf = bpf::load_xdp(bpf::REDIRECT, "redirect", &[("xsks", queues)], ifname, what)?;
        let xsks: XskMap<MapData> = bpf::take_map(&mut ebpf, "xsks", ifname, what)?;
        XdpProgram::attach_loaded(
            &mut ebpf,
            "redirect",
            ifname,
            Arc::new(Mutex::new(xsks)),
            0,
            queues,
        )
    }

    /// Attaches the XDP program `name` of the already loaded `ebpf` to `ifname` in generic
    /// mode, the interface's queue `q` going to the socket in slot `first + q` of `xsks`
    /// (`q < queues`): for programs other than this crate's, such as a table pipeline's.
    pub fn attach_loaded(
        ebpf: &mut Ebpf,
        name: &str,
        ifname: &str,
        xsks: Arc<Mutex<XskMap<MapData>>>,
        first: u32,
        queues: u32,
    ) -> Result<Arc<XdpProgram>> {
        let (ifindex, _) = interface_info(ifname)?;
        let ifindex = ifindex as u32;
        let link = attach_link(ebpf, name, ifname, ifindex)?;
        Ok(Arc::new(XdpProgram {
            ifname: ifname.to_owned(),
            ifindex,
            sockets: Sockets {
                map: xsks,
                first,
                count: queues.max(1),
            },
            _link: link,
        }))
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Sends the frames of `queue` to socket `fd`.
    fn register(&self, queue: u32, fd: RawFd) -> Result<()> {
        let what = "registering the socket in the XSKMAP";
        let s = &self.sockets;
        if queue >= s.count {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "queue {queue}: the program was attached for {} queue(s)",
                    s.count
                ),
            );
            return Err(dev_err(&self.ifname, what, e));
        }
        s.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set(s.first + queue, fd, 0)
            .map_err(|e| bpf::aya_err(&self.ifname, what, &e))
    }
}

/// Attaches the XDP program `name` of `ebpf` to `ifindex` in generic (SKB) mode through a BPF
/// link, which detaches it when dropped.
pub(crate) fn attach_link(
    ebpf: &mut Ebpf,
    name: &str,
    ifname: &str,
    ifindex: u32,
) -> Result<XdpLink> {
    let err = |e: ProgramError| bpf::aya_err(ifname, "attaching the XDP program (BPF link)", &e);
    let program = bpf::xdp(ebpf, name).map_err(err)?;
    let id = program
        .attach_to_if_index(ifindex, XdpMode::Skb)
        .map_err(err)?;
    program.take_link(id).map_err(err)
}

/// Settings of an [`AfXdp`] socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfXdpOptions {
    /// The interface queue.
    pub queue: u32,
    /// UMEM frames (half for receiving, half for sending); a power of two.
    pub frames: u32,
    /// Entries of each ring; a power of two, at most `frames`.
    pub ring: u32,
}

impl Default for AfXdpOptions {
    /// Queue 0, 4096 frames of 2 KiB (8 MiB), rings of 2048.
    fn default() -> Self {
        AfXdpOptions {
            queue: 0,
            frames: 4096,
            ring: 2048,
        }
    }
}

/// A mapped ring: producer, consumer, flags, entries.
struct Ring {
    map: NonNull<u8>,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
    size: u32,
}

impl Ring {
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the ring mapping, which lives as long as self.
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { (*self.flags).load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0 }
    }
    /// Entry `i` (u64 address rings).
    fn addr(&self, i: u32) -> *mut u64 {
        // SAFETY: (i & mask) < size entries of 8 bytes in the mapping.
        unsafe { self.desc.cast::<u64>().add((i & self.mask) as usize) }
    }
    /// Entry `i` (xdp_desc rings: addr u64, len u32, options u32).
    fn desc(&self, i: u32) -> *mut u8 {
        // SAFETY: (i & mask) < size entries of 16 bytes in the mapping.
        unsafe { self.desc.add((i & self.mask) as usize * 16) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_ring`, unmapped once.
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.map_len);
        }
    }
}

/// An AF_XDP socket on one queue of one interface. See the module documentation.
pub struct AfXdp {
    fd: OwnedFd,
    ifname: String,
    mac: [u8; 6],
    umem: NonNull<u8>,
    umem_len: usize,
    fill: Ring,
    comp: Ring,
    rx: Ring,
    tx: Ring,
    /// UMEM frames free for sending (capacity fixed at open).
    tx_free: Vec<u64>,
    _program: Arc<XdpProgram>,
    /// Frames not sent for want of a free UMEM frame or ring slot.
    pub send_drops: u64,
}

// SAFETY: the mappings are owned by this value and used only through `&mut self`.
unsafe impl Send for AfXdp {}

impl std::fmt::Debug for AfXdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfXdp")
            .field("interface", &self.ifname)
            .finish_non_exhaustive()
    }
}

impl Drop for AfXdp {
    fn drop(&mut self) {
        // SAFETY: the UMEM mapping made in `open`; the kernel drops its reference when the
        // socket (dropped after this) closes.
        unsafe {
            libc::munmap(self.umem.as_ptr().cast(), self.umem_len);
        }
    }
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

impl AfXdp {
    /// Opens a socket on `o.queue` of `ifname` and registers it with `program` (attached to
    /// the same interface).
    pub fn open(ifname: &str, program: Arc<XdpProgram>, o: &AfXdpOptions) -> Result<AfXdp> {
        if !o.frames.is_power_of_two() || !o.ring.is_power_of_two() || o.ring > o.frames {
            return Err(Error::Option {
                name: "frames",
                reason: format!(
                    "expected powers of two with ring <= frames, got frames {} ring {}",
                    o.frames, o.ring
                ),
            });
        }
        let (ifindex, mac) = interface_info(ifname)?;
        let err = |what: &'static str| move |e| dev_err(ifname, what, e);
        // SAFETY: plain socket call.
        let raw = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(err("opening an AF_XDP socket")(io::Error::last_os_error()));
        }
        let fd = owned(raw);
        let s = fd.as_raw_fd();

        let umem_len = o.frames as usize * FRAME_SIZE as usize;
        // SAFETY: an anonymous private mapping for the UMEM.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(err("allocating the UMEM")(io::Error::last_os_error()));
        }
        let Some(umem) = NonNull::new(base.cast::<u8>()) else {
            return Err(err("allocating the UMEM")(io::Error::other("null mapping")));
        };
        // From here on, a failure must unmap the UMEM: build the value early.
        let reg: [u64; 3] = [
            umem.as_ptr() as u64,
            umem_len as u64,
            u64::from(FRAME_SIZE), // chunk_size, headroom 0
        ];
        let setopt = |name: libc::c_int, p: *const libc::c_void, len: usize| {
            // SAFETY: p points at len readable bytes.
            let r = unsafe { libc::setsockopt(s, SOL_XDP, name, p, len as libc::socklen_t) };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        let unmap = |e: Error| {
            // SAFETY: the UMEM mapping made above, not used after this.
            unsafe {
                libc::munmap(umem.as_ptr().cast(), umem_len);
            }
            e
        };
        setopt(XDP_UMEM_REG, reg.as_ptr().cast(), 24)
            .map_err(err("registering the UMEM"))
            .map_err(unmap)?;
        for name in [
            XDP_UMEM_FILL_RING,
            XDP_UMEM_COMPLETION_RING,
            XDP_RX_RING,
            XDP_TX_RING,
        ] {
            setopt(name, (&o.ring as *const u32).cast(), 4)
                .map_err(err("sizing the rings"))
                .map_err(unmap)?;
        }
        let mut off = MmapOffsets::default();
        let mut len = std::mem::size_of::<MmapOffsets>() as libc::socklen_t;
        // SAFETY: off is a writable MmapOffsets of `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                s,
                SOL_XDP,
                XDP_MMAP_OFFSETS,
                (&mut off as *mut MmapOffsets).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(unmap(err("reading the ring offsets")(
                io::Error::last_os_error(),
            )));
        }
        let map_ring = |o_: RingOffset, entry: usize, pgoff: libc::off_t| -> Result<Ring> {
            let map_len = o_.desc as usize + o.ring as usize * entry;
            // SAFETY: maps a ring of this socket at its documented page offset.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    s,
                    pgoff,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(err("mapping a ring")(io::Error::last_os_error()));
            }
            let Some(map) = NonNull::new(p.cast::<u8>()) else {
                return Err(err("mapping a ring")(io::Error::other("null mapping")));
            };
            let at = |x: u64| {
                // SAFETY: the offsets the kernel gave lie inside the mapping.
                unsafe { map.as_ptr().add(x as usize) }
            };
            Ok(Ring {
                map,
                map_len,
                producer: at(o_.producer).cast(),
                consumer: at(o_.consumer).cast(),
                flags: at(o_.flags).cast(),
                desc: at(o_.desc),
                mask: o.ring - 1,
                size: o.ring,
            })
        };
        let fill = map_ring(off.fr, 8, XDP_UMEM_PGOFF_FILL_RING).map_err(unmap)?;
        let comp = map_ring(off.cr, 8, XDP_UMEM_PGOFF_COMPLETION_RING).map_err(unmap)?;
        let rx = map_ring(off.rx, 16, XDP_PGOFF_RX_RING).map_err(unmap)?;
        let tx = map_ring(off.tx, 16, XDP_PGOFF_TX_RING).map_err(unmap)?;

        let mut x = AfXdp {
            fd,
            ifname: ifname.to_owned(),
            mac,
            umem,
            umem_len,
            fill,
            comp,
            rx,
            tx,
            tx_free: Vec::with_capacity(o.frames as usize),
            _program: Arc::clone(&program),
            send_drops: 0,
        };
        // Half the frames to the fill ring (as many as it holds), the rest for sending.
        let rx_frames = (o.frames / 2).min(o.ring);
        for i in 0..rx_frames {
            // SAFETY: slot i of a fresh ring of `ring` >= rx_frames entries.
            unsafe { x.fill.addr(i).write(u64::from(i) * u64::from(FRAME_SIZE)) };
        }
        x.fill.producer().store(rx_frames, Ordering::Release);
        for i in rx_frames..o.frames {
            x.tx_free.push(u64::from(i) * u64::from(FRAME_SIZE));
        }

        // SAFETY: sockaddr_xdp = { family u16, flags u16, ifindex u32, queue u32, shared fd u32 }.
        let mut sa = [0u8; 16];
        sa[0..2].copy_from_slice(&(AF_XDP as u16).to_ne_bytes());
        sa[2..4].copy_from_slice(&(XDP_COPY | XDP_USE_NEED_WAKEUP).to_ne_bytes());
        sa[4..8].copy_from_slice(&(ifindex as u32).to_ne_bytes());
        sa[8..12].copy_from_slice(&o.queue.to_ne_bytes());
        // SAFETY: binds to the address just built.
        let r = unsafe { libc::bind(s, sa.as_ptr().cast(), sa.len() as libc::socklen_t) };
        if r != 0 {
            return Err(dev_err(
                ifname,
                "binding the AF_XDP socket to the queue",
                io::Error::last_os_error(),
            ));
        }
        program.register(o.queue, s)?;
        Ok(x)
    }

    fn kick_rx(&self) {
        if self.fill.needs_wakeup() {
            // SAFETY: a zero-length, non-blocking receive to wake the kernel.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
        }
    }

    /// Makes the kernel send what the TX ring holds. In copy mode each call sends at most 32
    /// frames, synchronously, and says EAGAIN when more are left: call once per 32 frames
    /// pending (plus one); what the device did not take stays in the ring for the next call.
    fn kick_tx(&mut self) -> Result<()> {
        let pending = self
            .tx
            .producer()
            .load(Ordering::Relaxed)
            .wrapping_sub(self.tx.consumer().load(Ordering::Acquire));
        for _ in 0..pending.div_ceil(32) + 1 {
            // SAFETY: a zero-length, non-blocking send that makes the kernel drain the ring.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // EAGAIN: the 32-frame budget of this call is spent (or the device queue
                    // was full): the bounded loop calls again.
                    Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                    Some(libc::EBUSY) | Some(libc::ENOBUFS) => break,
                    _ => return Err(dev_err(&self.ifname, "sending", e)),
                }
            }
        }
        Ok(())
    }

    /// Takes completed transmissions back into the free list.
    fn reclaim(&mut self) {
        let prod = self.comp.producer().load(Ordering::Acquire);
        let mut cons = self.comp.consumer().load(Ordering::Relaxed);
        while cons != prod && self.tx_free.len() < self.tx_free.capacity() {
            // SAFETY: entries between consumer and producer belong to us.
            let addr = unsafe { self.comp.addr(cons).read() };
            self.tx_free.push(addr);
            cons = cons.wrapping_add(1);
        }
        self.comp.consumer().store(cons, Ordering::Release);
    }
}

impl Port for AfXdp {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv_ready(
        &mut self,
        batch: &mut PacketBatch,
        port: u16,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<usize> {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        let mut fill = self.fill.producer().load(Ordering::Relaxed);
        let now = timestamp();
        let mut got = 0;
        while cons != prod && !batch.is_full() {
            // SAFETY: rx entries between consumer and producer are ours: addr u64, len u32.
            let (addr, len) = unsafe {
                let d = self.rx.desc(cons);
                (d.cast::<u64>().read(), d.add(8).cast::<u32>().read())
            };
            cons = cons.wrapping_add(1);
            let (a, n) = (addr as usize, len as usize);
            if a.checked_add(n).is_some_and(|end| end <= self.umem_len) {
                // SAFETY: a..a+n lies inside the UMEM (checked).
                let frame = unsafe { std::slice::from_raw_parts(self.umem.as_ptr().add(a), n) };
                if keep(frame) {
                    batch.push(
                        frame,
                        PacketMeta {
                            timestamp_ns: now,
                            wire_len: len,
                            port,
                            user: 0,
                        },
                    );
                    got += 1;
                }
            }
            // The frame goes straight back to the kernel (its chunk's start).
            // SAFETY: we consumed one rx entry, so one fill slot is free.
            unsafe {
                self.fill
                    .addr(fill)
                    .write(addr & !(u64::from(FRAME_SIZE) - 1))
            };
            fill = fill.wrapping_add(1);
        }
        self.rx.consumer().store(cons, Ordering::Release);
        self.fill.producer().store(fill, Ordering::Release);
        self.kick_rx();
        Ok(got)
    }

    fn send(&mut self, frames: &mut dyn Iterator<Item = &[u8]>) -> Result<usize> {
        self.reclaim();
        let cons = self.tx.consumer().load(Ordering::Acquire);
        let mut prod = self.tx.producer().load(Ordering::Relaxed);
        let mut sent = 0;
        for f in frames {
            let room = self.tx.size - prod.wrapping_sub(cons);
            let Some(addr) = (room > 0).then(|| self.tx_free.pop()).flatten() else {
                self.send_drops += 1;
                continue;
            };
            let n = f.len().min(FRAME_SIZE as usize);
            // SAFETY: addr is the start of a free UMEM frame of FRAME_SIZE bytes; the tx slot
            // at `prod` is ours (room > 0).
            unsafe {
                std::ptr::copy_nonoverlapping(f.as_ptr(), self.umem.as_ptr().add(addr as usize), n);
                let d = self.tx.desc(prod);
                d.cast::<u64>().write(addr);
                d.add(8).cast::<u32>().write(n as u32);
                d.add(12).cast::<u32>().write(0);
            }
            prod = prod.wrapping_add(1);
            sent += 1;
        }
        self.tx.producer().store(prod, Ordering::Release);
        self.kick_tx()?;
        Ok(sent)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }
}

/// Wall-clock nanoseconds (AF_XDP carries no receive timestamp).
fn timestamp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
