//! Batched UDP I/O: `recvmmsg` and `sendmmsg`, one system call per batch of datagrams, into
//! and out of buffers allocated once.
//!
//! Sending uses UDP generic segmentation offload (`UDP_SEGMENT`, Linux 4.18, `udp(7)`): a run
//! of datagrams to one peer with one length (the last may be shorter) goes down the stack as
//! one buffer of segments, cut into datagrams by the device or at the receiving socket. The
//! kernel walks its route, netfilter and device path once per run instead of once per
//! datagram. Where the kernel or device refuses it, the datagrams go one by one from then on.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

/// `UDP_SEGMENT` of `linux/udp.h` (not in `libc` for glibc targets).
const UDP_SEGMENT: libc::c_int = 103;
/// Most segments in one send (`UDP_MAX_SEGMENTS` of Linux 6.1).
const MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one send: an IPv4 datagram's 65,535 less its IP and UDP headers.
const MAX_PAYLOAD: usize = 65_535 - 20 - 8;

/// Room for one control message holding a `u16` (`CMSG_SPACE(2)` on 64-bit Linux).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct SegmentCmsg([u8; 24]);

/// Datagram buffers with their lengths and peers.
pub(crate) struct Datagrams {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    peers: Vec<libc::sockaddr_in>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// The control message (segment size) of each message of a send.
    cmsgs: Vec<SegmentCmsg>,
    /// Datagrams in each message of the last send, and their segment size.
    segments: Vec<(usize, usize)>,
    /// The first datagram of each message of the last send.
    firsts: Vec<usize>,
    /// Messages of the last send.
    messages: usize,
    /// Whether sends use `UDP_SEGMENT` (until the kernel refuses it once).
    gso: bool,
    /// The largest datagram sent in a message of several: a larger one than the path MTU
    /// cannot be a segment (`EMSGSIZE`), it goes alone and the kernel fragments it.
    gso_max: usize,
    /// Where the last send stopped for a segment too large, to go on from.
    resume: Option<usize>,
    n: usize,
}

impl std::fmt::Debug for Datagrams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datagrams")
            .field("capacity", &self.bufs.len())
            .field("len", &self.n)
            .finish()
    }
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn addr(s: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
        u16::from_be(s.sin_port),
    )
}

impl Datagrams {
    /// Room for `capacity` datagrams of up to `size` bytes each.
    pub(crate) fn new(capacity: usize, size: usize) -> Datagrams {
        let capacity = capacity.max(1);
        Datagrams {
            bufs: (0..capacity).map(|_| vec![0u8; size]).collect(),
            lens: vec![0; capacity],
            peers: vec![sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)); capacity],
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                capacity
            ],
            // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
            hdrs: vec![unsafe { std::mem::zeroed() }; capacity],
            cmsgs: vec![SegmentCmsg([0; 24]); capacity],
            segments: vec![(0, 0); capacity],
            firsts: vec![0; capacity],
            messages: 0,
            gso: true,
            gso_max: usize::MAX,
            resume: None,
            n: 0,
        }
    }

    /// Datagrams held.
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Whether none is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether no more fits.
    pub(crate) fn is_full(&self) -> bool {
        self.n == self.bufs.len()
    }

    /// Forgets every datagram.
    pub(crate) fn clear(&mut self) {
        self.n = 0;
    }

    /// Datagram `i` and its peer.
    pub(crate) fn get(&self, i: usize) -> (&[u8], SocketAddrV4) {
        (&self.bufs[i][..self.lens[i]], addr(&self.peers[i]))
    }

    /// Datagram `i`, to change in place (its length stays).
    pub(crate) fn get_mut(&mut self, i: usize) -> &mut [u8] {
        let n = self.lens[i];
        &mut self.bufs[i][..n]
    }

    /// Appends a datagram to `to`, written by `fill` into a buffer (returns its length; 0
    /// appends nothing). False when full.
    pub(crate) fn push_with(
        &mut self,
        to: SocketAddrV4,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.n;
        let len = fill(&mut self.bufs[i]).min(self.bufs[i].len());
        if len == 0 {
            return true;
        }
        self.lens[i] = len;
        self.peers[i] = sockaddr(to);
        self.n += 1;
        true
    }

    /// Receives what is ready (up to the free room) without blocking; how many came.
    pub(crate) fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let start = self.n;
        let room = self.bufs.len() - start;
        if room == 0 {
            return Ok(0);
        }
        for i in start..self.bufs.len() {
            self.iov[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            // SAFETY: as in `new`.
            self.hdrs[i] = unsafe { std::mem::zeroed() };
            self.hdrs[i].msg_hdr.msg_name = (&mut self.peers[i] as *mut libc::sockaddr_in).cast();
            self.hdrs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            self.hdrs[i].msg_hdr.msg_iov = &mut self.iov[i];
            self.hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: hdrs[start..] point at live buffers, iovecs and addresses of `self`, which
        // outlive the call; the kernel writes at most iov_len bytes into each buffer.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs[start..].as_mut_ptr(),
                room as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let got = r as usize;
        for i in start..start + got {
            self.lens[i] = self.hdrs[i].msg_len as usize;
        }
        self.n += got;
        Ok(got)
    }

    /// Sends the datagrams `pick` says yes to, each to its peer and in order (they stay held
    /// until [`Datagrams::clear`]); how many the kernel took (one it refused is lost, as on
    /// any UDP path).
    pub(crate) fn send(&mut self, fd: RawFd, pick: impl Fn(usize) -> bool) -> io::Result<usize> {
        let (mut from, mut done) = (0, 0);
        loop {
            self.resume = None;
            let gso = self.gso;
            match self.send_messages(fd, &|i| i >= from && pick(i), gso) {
                Err(e)
                    if gso
                        && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO))
                        && self.segments[..self.messages].iter().any(|s| s.0 > 1) =>
                {
                    tracing::info!(
                        "UDP segmentation offload refused ({e}): sending datagrams one by one"
                    );
                    self.gso = false;
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => return Ok(done),
                Ok(n) => {
                    done += n;
                    let Some(next) = self.resume else {
                        return Ok(done);
                    };
                    tracing::info!(
                        "datagrams of more than {} bytes exceed the path MTU: sent one per \
                         message (the kernel fragments them)",
                        self.gso_max
                    );
                    from = next;
                }
            }
        }
    }

    /// One `sendmmsg` call after another until every picked datagram is sent or the kernel
    /// refuses one; with `gso`, runs of datagrams go as one message each.
    fn send_messages(
        &mut self,
        fd: RawFd,
        pick: &impl Fn(usize) -> bool,
        gso: bool,
    ) -> io::Result<usize> {
        let (mut k, mut v) = (0, 0); // messages, iovecs
                                     // The message being filled: its first datagram, payload and last length.
        let mut run: Option<(usize, usize, usize)> = None;
        for i in 0..self.n {
            if !pick(i) {
                continue;
            }
            let len = self.lens[i];
            self.iov[v] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: len,
            };
            v += 1;
            if let Some((first, payload, last)) = run {
                let (a, b) = (&self.peers[first], &self.peers[i]);
                let (count, size) = self.segments[k - 1];
                if gso
                    && last == size
                    && len <= size
                    && size <= self.gso_max
                    && a.sin_addr.s_addr == b.sin_addr.s_addr
                    && a.sin_port == b.sin_port
                    && count < MAX_SEGMENTS
                    && payload + len <= MAX_PAYLOAD
                {
                    self.hdrs[k - 1].msg_hdr.msg_iovlen += 1;
                    self.segments[k - 1].0 += 1;
                    run = Some((first, payload + len, len));
                    continue;
                }
            }
            // SAFETY: as in `new`.
            self.hdrs[k] = unsafe { std::mem::zeroed() };
            let h = &mut self.hdrs[k].msg_hdr;
            h.msg_name = (&mut self.peers[i] as *mut libc::sockaddr_in).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            h.msg_iov = &mut self.iov[v - 1];
            h.msg_iovlen = 1;
            self.segments[k] = (1, len);
            self.firsts[k] = i;
            run = Some((i, len, len));
            k += 1;
        }
        self.messages = k;
        // Messages of several datagrams carry their segment size.
        for m in 0..k {
            let (count, size) = self.segments[m];
            if count < 2 {
                continue;
            }
            let h = &mut self.hdrs[m].msg_hdr;
            h.msg_control = self.cmsgs[m].0.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE is a pure computation.
            h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
            // SAFETY: msg_control points at 24 bytes aligned for cmsghdr, room for one
            // control message with 2 bytes of data (CMSG_SPACE(2)).
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), size as u16);
            }
        }
        let mut sent = 0; // messages
        let mut datagrams = 0;
        while sent < k {
            // SAFETY: hdrs[sent..k] point at live buffers, iovecs, addresses and control
            // messages of `self`.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[sent..k].as_mut_ptr(),
                    (k - sent) as libc::c_uint,
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // Segments larger than the path MTU: from this message on, datagrams that
                // large go one per message.
                if gso && e.raw_os_error() == Some(libc::EMSGSIZE) && self.segments[sent].0 > 1 {
                    self.gso_max = self.segments[sent].1 - 1;
                    self.resume = Some(self.firsts[sent]);
                    return Ok(datagrams);
                }
                // A full socket buffer or an unreachable peer: the rest is lost.
                return if datagrams > 0 || e.kind() == io::ErrorKind::WouldBlock {
                    Ok(datagrams)
                } else {
                    Err(e)
                };
            }
            let r = r as usize;
            datagrams += self.segments[sent..sent + r]
                .iter()
                .map(|s| s.0)
                .sum::<usize>();
            sent += r;
        }
        Ok(datagrams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_batch_goes_and_comes_back_with_its_peers() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        b.set_nonblocking(true).unwrap();
        let (std::net::SocketAddr::V4(at_a), std::net::SocketAddr::V4(at_b)) =
            (a.local_addr().unwrap(), b.local_addr().unwrap())
        else {
            panic!("IPv4 sockets");
        };
        let mut out = Datagrams::new(8, 64);
        for i in 0..5u8 {
            assert!(out.push_with(at_b, |buf| {
                buf[..3].copy_from_slice(&[i, i, i]);
                3
            }));
        }
        assert_eq!(out.send(a.as_raw_fd(), |i| i != 2).unwrap(), 4);
        out.clear();
        assert!(out.is_empty());
        let mut inp = Datagrams::new(8, 64);
        let mut got = 0;
        for _ in 0..100 {
            got += inp.recv(b.as_raw_fd()).unwrap();
            if got == 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, 4);
        let firsts: Vec<u8> = (0..4).map(|i| inp.get(i).0[0]).collect();
        assert_eq!(firsts, vec![0, 1, 3, 4]);
        assert!((0..4).all(|i| inp.get(i).1 == at_a && inp.get(i).0.len() == 3));
        inp.get_mut(0)[0] = 9;
        assert_eq!(inp.get(0).0, &[9, 0, 0]);
        // Nothing more: no wait, no error.
        assert_eq!(inp.recv(b.as_raw_fd()).unwrap(), 0);
    }

    #[test]
    fn runs_go_segmented_and_arrive_as_the_datagrams_sent() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to: Vec<_> = (0..2)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let at: Vec<SocketAddrV4> = to
            .iter()
            .map(|s| match s.local_addr().unwrap() {
                std::net::SocketAddr::V4(a) => a,
                _ => panic!("IPv4 sockets"),
            })
            .collect();
        // (peer, length): a run of 70 (more than one message holds), a short tail, a run to
        // the other peer, a longer one that cannot join, single datagrams.
        let mut plan: Vec<(usize, usize)> = (0..70).map(|_| (0, 900)).collect();
        plan.extend([(0, 300), (0, 300), (1, 500), (1, 500), (1, 700), (0, 64)]);
        let mut out = Datagrams::new(plan.len(), 1024);
        for (i, &(peer, len)) in plan.iter().enumerate() {
            assert!(out.push_with(at[peer], |buf| {
                buf[..len].fill(i as u8);
                len
            }));
        }
        assert_eq!(out.send(a.as_raw_fd(), |_| true).unwrap(), plan.len());
        assert!(out.gso, "the kernel took the segmented sends");
        for (peer, sock) in to.iter().enumerate() {
            sock.set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .unwrap();
            let want: Vec<(u8, usize)> = plan
                .iter()
                .enumerate()
                .filter(|(_, p)| p.0 == peer)
                .map(|(i, p)| (i as u8, p.1))
                .collect();
            let mut buf = [0u8; 2048];
            let got: Vec<(u8, usize)> = want
                .iter()
                .map(|_| {
                    let n = sock.recv(&mut buf).unwrap();
                    assert!(buf[..n].iter().all(|&b| b == buf[0]));
                    (buf[0], n)
                })
                .collect();
            assert_eq!(got, want);
        }
    }
}
