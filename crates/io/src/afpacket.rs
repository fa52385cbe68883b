//! AF_PACKET ports: a memory-mapped receive ring (TPACKET_V2 or TPACKET_V3) and batched send
//! (`sendmmsg`).
//!
//! Promises:
//! * [`AfPacket::open`] checks everything once (the interface exists, the process may open a
//!   packet socket, the kernel has the ring version asked for) and says what is missing in its
//!   error.
//! * Receiving copies each frame from the kernel's ring into the caller's [`PacketBatch`]
//!   (one `memcpy`, no allocation) and hands the ring slot back to the kernel as soon as it was
//!   taken. Sending a batch is one `sendmmsg` call over headers prepared once.
//! * Two ring layouts ([`RingVersion`]). **TPACKET_V2** (the default) has one slot per frame:
//!   the kernel hands each frame over, and wakes a waiting `poll`, as soon as it is written, so
//!   a frame waits for nobody. **TPACKET_V3** packs frames into blocks and hands a block over
//!   only when it is full or its retire timer ([`AfPacketOptions::block_timeout`], 1 ms at
//!   least) fires: fewer wake-ups for a capture at line rate, but every frame of a slow flow (a
//!   TCP connection's ACKs) waits up to that timeout, which a forwarding box cannot afford.
//! * Frames this host sends on the interface are not received again (`PACKET_IGNORE_OUTGOING`,
//!   and a check of the packet type), so a box that receives and sends on one port does not
//!   see its own output.
//! * Several sockets on one interface may share the traffic with `PACKET_FANOUT`
//!   ([`Fanout`]), one per worker.
//!
//! * A VLAN tag the kernel took out of a received frame into the ring's header (receive VLAN
//!   offload) is put back in the frame, so the frame is as it was on the wire.
//!
//! Limits: frames longer than the
//! batch's buffers are truncated (their `wire_len` says so). Checksums are as the interface
//! delivers them: on virtual interfaces with transmit offloads on, frames sent by local stacks
//! may carry partial checksums (the lab turns offloads off).

use crate::{Error, PacketBatch, PacketMeta, Port, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

const ETH_P_ALL: u16 = 0x0003;
const TPACKET_V2: libc::c_int = 1;
const TPACKET_V3: libc::c_int = 2;
/// `sizeof(struct tpacket2_hdr)`, already `TPACKET_ALIGN`ed: the `sockaddr_ll` follows.
const TPACKET2_HDRLEN: usize = 32;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
/// The kernel took the frame's outer VLAN tag into the header (`tp_vlan_tci`).
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// ... and its TPID (`tp_vlan_tpid`; else 802.1Q's 0x8100).
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
const ETH_P_8021Q: u16 = 0x8100;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_OUTGOING: u8 = 4;
const PACKET_QDISC_BYPASS: libc::c_int = 20;

/// How several sockets of one interface share its traffic (`PACKET_FANOUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fanout {
    /// The group id: sockets with the same id (on the same interface) share the traffic.
    pub group: u16,
    /// How packets are spread.
    pub mode: FanoutMode,
}

/// `PACKET_FANOUT_*` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutMode {
    /// By the kernel's flow hash (`PACKET_FANOUT_HASH`): a flow's packets go to one socket.
    Hash,
    /// By the CPU the packet arrived on (`PACKET_FANOUT_CPU`).
    Cpu,
    /// By the receive queue (`PACKET_FANOUT_QM`).
    Queue,
}

impl FanoutMode {
    fn raw(self) -> u32 {
        match self {
            FanoutMode::Hash => 0,
            FanoutMode::Cpu => 2,
            FanoutMode::Queue => 5,
        }
    }
}

/// The receive ring's layout (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingVersion {
    /// One slot per frame, each handed over as soon as it is written (low latency).
    #[default]
    V2,
    /// Blocks of frames, handed over when full or after `block_timeout` (fewer wake-ups).
    V3,
}

/// Settings of an [`AfPacket`] socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfPacketOptions {
    /// Receive at all (`false`: a send-only socket, no ring, bound with protocol 0).
    pub receive: bool,
    /// The receive ring's layout.
    pub ring: RingVersion,
    /// Ring block size in bytes (a multiple of the page size).
    pub block_size: u32,
    /// TPACKET_V2 slot size in bytes (a power of two from 2048 to `block_size`); frames longer
    /// than the slot minus its 66-byte header are truncated.
    pub frame_size: u32,
    /// Number of ring blocks.
    pub block_count: u32,
    /// How long the kernel keeps a partly filled block before handing it over (TPACKET_V3).
    pub block_timeout: Duration,
    /// Share the traffic with other sockets.
    pub fanout: Option<Fanout>,
    /// Packets per `sendmmsg` call at most (headers prepared for this many).
    pub send_batch: usize,
    /// Send straight to the device driver (`PACKET_QDISC_BYPASS`, Linux 3.14+): no queueing
    /// discipline, and the interface's own taps (a `tcpdump` on this host's end) do not see
    /// the frames sent; captures elsewhere do. Ignored where the kernel lacks it.
    pub qdisc_bypass: bool,
}

impl Default for AfPacketOptions {
    /// TPACKET_V2, 64 blocks of 256 KiB (16 MiB of ring: 8192 slots of 2 KiB), V3 blocks
    /// retired after 1 ms, 64 per send.
    fn default() -> Self {
        AfPacketOptions {
            receive: true,
            ring: RingVersion::V2,
            block_size: 1 << 18,
            frame_size: 2048,
            block_count: 64,
            block_timeout: Duration::from_millis(1),
            fanout: None,
            send_batch: 64,
            qdisc_bypass: false,
        }
    }
}

impl AfPacketOptions {
    /// The default receive ring with slots that hold frames of `max_frame` bytes: 2 KiB
    /// slots hold frames up to 1982 bytes (the slot's header and address take 66), enough
    /// for a 1500-byte MTU and dense for small frames; a larger `max_frame` (jumbo frames)
    /// gets slots that hold it.
    pub fn receiving(max_frame: usize) -> AfPacketOptions {
        let frame_size = if max_frame <= 2048 {
            2048
        } else {
            (max_frame + 66).next_power_of_two().min(1 << 16) as u32
        };
        AfPacketOptions {
            frame_size,
            block_size: frame_size.max(1 << 18),
            ..AfPacketOptions::default()
        }
    }
}

/// A packet socket bound to one interface. See the module documentation.
pub struct AfPacket {
    fd: OwnedFd,
    ifname: String,
    ifindex: i32,
    mac: [u8; 6],
    ring: Option<Ring>,
    /// `sendmmsg` headers, prepared once; their iovecs point into the batch being sent.
    iovecs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    addr: libc::sockaddr_ll,
    /// Frames the kernel refused to send (`ENOBUFS` and the like) and dropped.
    pub send_drops: u64,
}

// SAFETY: the raw pointers (ring mapping, iovecs) are owned by this value and only used
// through `&mut self`.
unsafe impl Send for AfPacket {}

impl std::fmt::Debug for AfPacket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacket")
            .field("interface", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("receive", &self.ring.is_some())
            .finish()
    }
}

struct Ring {
    version: RingVersion,
    base: NonNull<u8>,
    len: usize,
    /// TPACKET_V2: slot size and count (the slot being read is `block`).
    frame_size: usize,
    frame_count: usize,
    block_size: usize,
    block_count: usize,
    /// The block being read.
    block: usize,
    /// Frames of the current block already taken, and the offset of the next one.
    taken: u32,
    next: usize,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping made in `Ring::map`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

fn sys_err(what: &str, ifname: &str, e: io::Error) -> Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (needs CAP_NET_RAW: run as root or grant the capability)"
        }
        Some(libc::ENODEV) => " (no such interface in this network namespace)",
        Some(libc::EAFNOSUPPORT) => " (the kernel has no AF_PACKET support: CONFIG_PACKET)",
        Some(libc::EINVAL) if what.contains("TPACKET_V3") => {
            " (the kernel lacks TPACKET_V3: Linux 3.2 or later)"
        }
        Some(libc::EINVAL) if what.contains("TPACKET_V2") => {
            " (the kernel lacks TPACKET_V2: Linux 2.6.27 or later)"
        }
        _ => "",
    };
    Error::Device {
        device: ifname.to_owned(),
        what: format!("{what}{hint}").into(),
        source: e,
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The index and MAC address of interface `name` (in the caller's network namespace).
pub fn interface_info(name: &str) -> Result<(i32, [u8; 6])> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(Error::Option {
            name: "interface",
            reason: format!("{name:?} is not an interface name (1 to 15 bytes)"),
        });
    }
    // SAFETY: plain socket call.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(sys_err("socket", name, io::Error::last_os_error()));
    }
    // SAFETY: raw is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFINDEX/SIOCGIFHWADDR fill the ifreq we pass.
    let index = unsafe {
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) < 0 {
            return Err(sys_err(
                "looking up the interface",
                name,
                io::Error::last_os_error(),
            ));
        }
        req.ifr_ifru.ifru_ifindex
    };
    // SAFETY: as above.
    let mac = unsafe {
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) < 0 {
            return Err(sys_err(
                "reading the MAC address",
                name,
                io::Error::last_os_error(),
            ));
        }
        let d = req.ifr_ifru.ifru_hwaddr.sa_data;
        [d[0], d[1], d[2], d[3], d[4], d[5]].map(|b| b as u8)
    };
    Ok((index, mac))
}

impl AfPacket {
    /// Opens a packet socket on interface `ifname`. See [`AfPacketOptions`].
    pub fn open(ifname: &str, o: &AfPacketOptions) -> Result<AfPacket> {
        let (ifindex, mac) = interface_info(ifname)?;
        let protocol = if o.receive { ETH_P_ALL.to_be() } else { 0 };
        // SAFETY: plain socket call.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::c_int::from(protocol),
            )
        };
        if raw < 0 {
            return Err(sys_err(
                "opening an AF_PACKET socket",
                ifname,
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = fd.as_raw_fd();

        let mut ring = None;
        if o.receive {
            let (version, name) = match o.ring {
                RingVersion::V2 => (TPACKET_V2, "TPACKET_V2"),
                RingVersion::V3 => (TPACKET_V3, "TPACKET_V3"),
            };
            setsockopt(s, libc::SOL_PACKET, libc::PACKET_VERSION, &version)
                .map_err(|e| sys_err(&format!("selecting {name}"), ifname, e))?;
            let page = 4096u32;
            if o.block_size < page || !o.block_size.is_multiple_of(page) || o.block_count == 0 {
                return Err(Error::Option {
                    name: "block_size",
                    reason: format!(
                        "expected a multiple of {page} and at least one block, got {} x {}",
                        o.block_size, o.block_count
                    ),
                });
            }
            let frame_size = match o.ring {
                RingVersion::V3 => 2048u32,
                RingVersion::V2 => {
                    let f = o.frame_size;
                    if !f.is_power_of_two() || f < 2048 || f > o.block_size {
                        return Err(Error::Option {
                            name: "frame_size",
                            reason: format!(
                                "expected a power of two from 2048 to the block size {}, got {f}",
                                o.block_size
                            ),
                        });
                    }
                    f
                }
            };
            let frame_count = o.block_size / frame_size * o.block_count;
            let set = match o.ring {
                RingVersion::V3 => {
                    let req = libc::tpacket_req3 {
                        tp_block_size: o.block_size,
                        tp_block_nr: o.block_count,
                        tp_frame_size: frame_size,
                        tp_frame_nr: frame_count,
                        tp_retire_blk_tov: o.block_timeout.as_millis().clamp(1, 1000) as u32,
                        tp_sizeof_priv: 0,
                        tp_feature_req_word: 0,
                    };
                    setsockopt(s, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
                }
                RingVersion::V2 => {
                    let req = libc::tpacket_req {
                        tp_block_size: o.block_size,
                        tp_block_nr: o.block_count,
                        tp_frame_size: frame_size,
                        tp_frame_nr: frame_count,
                    };
                    setsockopt(s, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
                }
            };
            set.map_err(|e| sys_err(&format!("setting up the {name} receive ring"), ifname, e))?;
            let len = o.block_size as usize * o.block_count as usize;
            // SAFETY: maps the ring the kernel just made for this socket.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    s,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(sys_err(
                    "mapping the receive ring",
                    ifname,
                    io::Error::last_os_error(),
                ));
            }
            let Some(base) = NonNull::new(base.cast::<u8>()) else {
                return Err(sys_err(
                    "mapping the receive ring",
                    ifname,
                    io::Error::other("null mapping"),
                ));
            };
            ring = Some(Ring {
                version: o.ring,
                base,
                len,
                frame_size: frame_size as usize,
                frame_count: frame_count as usize,
                block_size: o.block_size as usize,
                block_count: o.block_count as usize,
                block: 0,
                taken: 0,
                next: 0,
            });
            // Do not receive what this host sends (Linux 4.20+; older kernels: filtered below).
            let _ = setsockopt(s, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32);
        }

        // SAFETY: sockaddr_ll is plain data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol;
        addr.sll_ifindex = ifindex;
        addr.sll_halen = 6;
        // SAFETY: binds to the address just built.
        let r = unsafe {
            libc::bind(
                s,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(sys_err(
                "binding to the interface",
                ifname,
                io::Error::last_os_error(),
            ));
        }
        if o.qdisc_bypass {
            // Best effort: without it frames go through the qdisc, which is only slower.
            let _ = setsockopt(s, libc::SOL_PACKET, PACKET_QDISC_BYPASS, &1i32);
        }
        if let (Some(f), true) = (o.fanout, o.receive) {
            let arg: u32 = u32::from(f.group) | (f.mode.raw() << 16);
            setsockopt(s, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
                .map_err(|e| sys_err("joining the PACKET_FANOUT group", ifname, e))?;
        }

        let n = o.send_batch.max(1);
        // SAFETY: iovec and mmsghdr are plain data; zero is valid.
        let iovecs = vec![unsafe { std::mem::zeroed::<libc::iovec>() }; n];
        let msgs = vec![unsafe { std::mem::zeroed::<libc::mmsghdr>() }; n];
        Ok(AfPacket {
            fd,
            ifname: ifname.to_owned(),
            ifindex,
            mac,
            ring,
            iovecs,
            msgs,
            addr,
            send_drops: 0,
        })
    }

    /// The interface's name.
    pub fn interface(&self) -> &str {
        &self.ifname
    }

    fn dev_err(&self, what: &str, e: io::Error) -> Error {
        sys_err(what, &self.ifname, e)
    }
}

/// Reads a `u32` of the ring at `p` (the kernel writes it concurrently).
///
/// # Safety
/// `p` must point into the mapped ring, 4-byte aligned.
#[inline]
unsafe fn ring_u32(p: *const u8) -> u32 {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::read_volatile(p.cast::<u32>()) }
}

/// Puts back the VLAN tag the kernel took into the ring's header, `(tci, tpid)` (802.1Q's
/// TPID when `status` says none was given): the MAC addresses move 4 bytes earlier and the
/// tag follows them (IEEE 802.1Q §9). Returns the
/// frame's new start, or `start` when fewer than 4 bytes lie between `free` and it, or the
/// frame has no MAC addresses (left untagged).
///
/// # Safety
/// `base + free .. base + end` must be writable memory of one ring slot or block, owned by the
/// caller.
unsafe fn retag(
    base: *mut u8,
    start: usize,
    end: usize,
    free: usize,
    status: u32,
    (tci, tpid): (u16, u16),
) -> usize {
    if start < free + 4 || end < start + 12 {
        return start;
    }
    let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
        tpid
    } else {
        ETH_P_8021Q
    };
    // SAFETY: start - 4 .. end is inside the caller's memory (checked above and by the caller).
    unsafe {
        std::ptr::copy(base.add(start), base.add(start - 4), 12);
        let tag = base.add(start + 8);
        std::ptr::copy_nonoverlapping(tpid.to_be_bytes().as_ptr(), tag, 2);
        std::ptr::copy_nonoverlapping(tci.to_be_bytes().as_ptr(), tag.add(2), 2);
    }
    start - 4
}

impl Port for AfPacket {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv_ready(
        &mut self,
        batch: &mut PacketBatch,
        port: u16,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<usize> {
        match self.ring.as_mut() {
            None => Ok(0),
            Some(r) if r.version == RingVersion::V2 => Ok(r.recv_v2(batch, port, keep)),
            Some(r) => Ok(r.recv_v3(batch, port, keep)),
        }
    }

    fn send(&mut self, frames: &mut dyn Iterator<Item = &[u8]>) -> Result<usize> {
        self.send_frames(frames)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        self.ring.as_ref().map(|_| self.fd.as_raw_fd())
    }
}

impl Ring {
    /// TPACKET_V2: takes the frames of consecutive user-owned slots.
    fn recv_v2(
        &mut self,
        batch: &mut PacketBatch,
        port: u16,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> usize {
        let mut got = 0;
        // At most one pass over the ring.
        for _ in 0..self.frame_count {
            if batch.is_full() {
                break;
            }
            // SAFETY: block < frame_count and the slots tile the mapping (the block size is a
            // multiple of the slot size); slots are 16-aligned.
            let h = unsafe { self.base.as_ptr().add(self.block * self.frame_size) };
            // SAFETY: tp_status at offset 0 of tpacket2_hdr.
            let status = unsafe { ring_u32(h) };
            if status & TP_STATUS_USER == 0 {
                break;
            }
            fence(Ordering::Acquire);
            // SAFETY: tpacket2_hdr fields: len 4, snaplen 8, mac 12 (u16), sec 16, nsec 20;
            // the sockaddr_ll's pkttype at 32 + 10.
            let (len, snap, mac, sec, nsec, pkttype) = unsafe {
                (
                    ring_u32(h.add(4)),
                    ring_u32(h.add(8)),
                    std::ptr::read_volatile(h.add(12).cast::<u16>()),
                    ring_u32(h.add(16)),
                    ring_u32(h.add(20)),
                    std::ptr::read_volatile(h.add(TPACKET2_HDRLEN + 10)),
                )
            };
            let mut start = usize::from(mac);
            let end = start + snap as usize;
            // The slot's bytes before the frame: the header and sockaddr_ll (20 bytes).
            let free = TPACKET2_HDRLEN + 20;
            if start >= free && end <= self.frame_size && pkttype != PACKET_OUTGOING {
                if status & TP_STATUS_VLAN_VALID != 0 {
                    // SAFETY: tp_vlan_tci at 24, tp_vlan_tpid at 26; start - 4 >= free is
                    // checked by retag before it writes.
                    let (tci, tpid) = unsafe {
                        (
                            std::ptr::read_volatile(h.add(24).cast::<u16>()),
                            std::ptr::read_volatile(h.add(26).cast::<u16>()),
                        )
                    };
                    // SAFETY: the slot is the user's until it is handed back; start..end is
                    // inside it.
                    start = unsafe { retag(h, start, end, free, status, (tci, tpid)) };
                }
                // SAFETY: start..end is inside this slot (checked above).
                let frame = unsafe { std::slice::from_raw_parts(h.add(start), end - start) };
                if keep(frame) {
                    batch.push(
                        frame,
                        PacketMeta {
                            timestamp_ns: u64::from(sec) * 1_000_000_000 + u64::from(nsec),
                            wire_len: len,
                            port,
                            user: 0,
                        },
                    );
                    got += 1;
                }
            }
            fence(Ordering::Release);
            // SAFETY: hands the slot back: tp_status = TP_STATUS_KERNEL.
            unsafe { std::ptr::write_volatile(h.cast::<u32>(), TP_STATUS_KERNEL) };
            self.block = (self.block + 1) % self.frame_count;
        }
        got
    }

    /// TPACKET_V3: takes the frames of retired blocks.
    fn recv_v3(
        &mut self,
        batch: &mut PacketBatch,
        port: u16,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> usize {
        let r = self;
        let mut got = 0;
        // At most one pass over the ring.
        for _ in 0..=r.block_count {
            if batch.is_full() {
                break;
            }
            // SAFETY: block < block_count: inside the mapping; descriptors are 8-aligned.
            let block = unsafe { r.base.as_ptr().add(r.block * r.block_size) };
            // SAFETY: block_status at offset 8 of tpacket_block_desc.
            let status = unsafe { ring_u32(block.add(8)) };
            if status & TP_STATUS_USER == 0 {
                break;
            }
            fence(Ordering::Acquire);
            // SAFETY: num_pkts (12) and offset_to_first_pkt (16) of the block header.
            let (count, first) = unsafe { (ring_u32(block.add(12)), ring_u32(block.add(16))) };
            if r.taken == 0 {
                r.next = first as usize;
            }
            while r.taken < count && !batch.is_full() {
                if r.next + 64 > r.block_size {
                    // A corrupt offset: give up on the rest of the block.
                    r.taken = count;
                    break;
                }
                // SAFETY: r.next + header and sockaddr_ll (64 bytes) is inside the block (checked above).
                let h = unsafe { block.add(r.next) };
                // SAFETY: tpacket3_hdr fields: next_offset 0, sec 4, nsec 8, snaplen 12,
                // len 16, mac 24 (u16).
                let (next, sec, nsec, snap, len, mac) = unsafe {
                    (
                        ring_u32(h),
                        ring_u32(h.add(4)),
                        ring_u32(h.add(8)),
                        ring_u32(h.add(12)),
                        ring_u32(h.add(16)),
                        std::ptr::read_volatile(h.add(24).cast::<u16>()),
                    )
                };
                let mut start = r.next + usize::from(mac);
                let end = start + snap as usize;
                r.taken += 1;
                if next == 0 {
                    r.taken = count;
                } else {
                    r.next += next as usize;
                }
                if end > r.block_size {
                    continue;
                }
                // The sockaddr_ll follows the header (aligned to 16): its pkttype byte.
                // SAFETY: inside the frame slot, which holds header, sockaddr_ll, data.
                let pkttype = unsafe {
                    let sll = h.add(48);
                    std::ptr::read_volatile(sll.add(10))
                };
                if pkttype == PACKET_OUTGOING {
                    continue;
                }
                // SAFETY: tpacket3_hdr: tp_status at 20, hv1.tp_vlan_tci at 32 (u32),
                // hv1.tp_vlan_tpid at 36.
                let (status, tci, tpid) = unsafe {
                    (
                        ring_u32(h.add(20)),
                        ring_u32(h.add(32)) as u16,
                        std::ptr::read_volatile(h.add(36).cast::<u16>()),
                    )
                };
                if status & TP_STATUS_VLAN_VALID != 0 {
                    // SAFETY: the block is the user's until it is handed back; the frame's
                    // header and sockaddr_ll (48 + 20 bytes) come before `start`.
                    start = unsafe { retag(block, start, end, r.next + 68, status, (tci, tpid)) };
                }
                // SAFETY: start..end is inside the block (checked above).
                let frame = unsafe { std::slice::from_raw_parts(block.add(start), end - start) };
                if !keep(frame) {
                    continue;
                }
                batch.push(
                    frame,
                    PacketMeta {
                        timestamp_ns: u64::from(sec) * 1_000_000_000 + u64::from(nsec),
                        wire_len: len,
                        port,
                        user: 0,
                    },
                );
                got += 1;
            }
            if r.taken >= count {
                fence(Ordering::Release);
                // SAFETY: hands the block back: block_status = TP_STATUS_KERNEL.
                unsafe {
                    std::ptr::write_volatile(block.add(8).cast::<u32>(), TP_STATUS_KERNEL);
                }
                r.block = (r.block + 1) % r.block_count;
                r.taken = 0;
                r.next = 0;
            }
        }
        got
    }
}

impl AfPacket {
    fn send_frames(&mut self, frames: &mut dyn Iterator<Item = &[u8]>) -> Result<usize> {
        let mut sent = 0;
        loop {
            let mut n = 0;
            while n < self.msgs.len() {
                let Some(f) = frames.next() else { break };
                self.iovecs[n] = libc::iovec {
                    iov_base: f.as_ptr() as *mut libc::c_void,
                    iov_len: f.len(),
                };
                n += 1;
            }
            if n == 0 {
                return Ok(sent);
            }
            for i in 0..n {
                let m = &mut self.msgs[i].msg_hdr;
                m.msg_name = (&mut self.addr as *mut libc::sockaddr_ll).cast();
                m.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                m.msg_iov = &mut self.iovecs[i];
                m.msg_iovlen = 1;
                m.msg_control = std::ptr::null_mut();
                m.msg_controllen = 0;
                m.msg_flags = 0;
            }
            let mut off = 0;
            while off < n {
                // SAFETY: msgs[off..n] are prepared above; their iovecs point at frames that
                // live for this call.
                let r = unsafe {
                    libc::sendmmsg(
                        self.fd.as_raw_fd(),
                        self.msgs[off..].as_mut_ptr(),
                        (n - off) as libc::c_uint,
                        0,
                    )
                };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                        // The queue is full, the frame too big, the link down: drop this one.
                        Some(libc::ENOBUFS) | Some(libc::EMSGSIZE) | Some(libc::ENETDOWN)
                        | Some(libc::ENXIO) => {
                            self.send_drops += 1;
                            off += 1;
                        }
                        _ => return Err(self.dev_err("sending", e)),
                    }
                } else {
                    off += r as usize;
                    sent += r as usize;
                }
            }
        }
    }
}

/// Waits until one of `fds` is readable or `timeout` passes. Returns whether one is.
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> Result<bool> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 8];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(fds) {
        *p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: pfds[..n] are valid pollfds.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(Error::Device {
            device: "poll".into(),
            what: "waiting for packets".into(),
            source: e,
        });
    }
    let mut readable = false;
    for p in &pfds[..n] {
        if p.revents & libc::POLLNVAL != 0 {
            return Err(Error::Device {
                device: "poll".into(),
                what: format!("descriptor {} is not open", p.fd).into(),
                source: io::Error::from_raw_os_error(libc::EBADF),
            });
        }
        if p.revents & libc::POLLERR != 0 {
            // A socket error (an AF_PACKET socket's link went down or away: ENETDOWN) keeps
            // the socket polling ready until it is read: read it, so that the next wait
            // waits instead of spinning. (A port whose interface is gone is the role's to
            // notice: `interface_exists`.)
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: SO_ERROR writes one c_int into `err`, `len` its size.
            unsafe {
                libc::getsockopt(
                    p.fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
        }
        readable |= p.revents & libc::POLLIN != 0;
    }
    Ok(readable)
}

/// Whether a network interface called `name` exists in this network namespace (a veth whose
/// peer's namespace was deleted is gone with it).
pub fn interface_exists(name: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    unsafe { libc::if_nametoindex(name.as_ptr()) != 0 }
}

/// Whether `addr` is assigned to an interface of this network namespace (`None`: the list of
/// addresses cannot be read).
pub fn address_assigned(addr: std::net::Ipv4Addr) -> Option<bool> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` on success; it is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let want = u32::from(addr).to_be();
    let mut found = false;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is an element of the list getifaddrs made; an AF_INET address is a
        // sockaddr_in.
        unsafe {
            let a = (*at).ifa_addr;
            if !a.is_null() && i32::from((*a).sa_family) == libc::AF_INET {
                found |= (*a.cast::<libc::sockaddr_in>()).sin_addr.s_addr == want;
            }
            at = (*at).ifa_next;
        }
    }
    // SAFETY: the list getifaddrs made, freed once.
    unsafe { libc::freeifaddrs(list) };
    Some(found)
}
