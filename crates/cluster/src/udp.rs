//! Batched UDP I/O: `recvmmsg` and `sendmmsg`, one system call per batch of datagrams, into
//! and out of buffers allocated once.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

/// Datagram buffers with their lengths and peers.
pub(crate) struct Datagrams {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    peers: Vec<libc::sockaddr_in>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
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

    /// Sends the datagrams `pick` says yes to, each to its peer (they stay held until
    /// [`Datagrams::clear`]); how many the kernel took (one it refused is lost, as on any
    /// UDP path).
    pub(crate) fn send(
        &mut self,
        fd: RawFd,
        mut pick: impl FnMut(usize) -> bool,
    ) -> io::Result<usize> {
        let mut k = 0;
        for i in 0..self.n {
            if !pick(i) {
                continue;
            }
            self.iov[k] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.lens[i],
            };
            // SAFETY: as in `new`.
            self.hdrs[k] = unsafe { std::mem::zeroed() };
            self.hdrs[k].msg_hdr.msg_name = (&mut self.peers[i] as *mut libc::sockaddr_in).cast();
            self.hdrs[k].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            self.hdrs[k].msg_hdr.msg_iov = &mut self.iov[k];
            self.hdrs[k].msg_hdr.msg_iovlen = 1;
            k += 1;
        }
        let mut sent = 0;
        while sent < k {
            // SAFETY: hdrs[sent..k] point at live buffers and addresses of `self`.
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
                // A full socket buffer or an unreachable peer: the rest is lost.
                return if sent > 0 || e.kind() == io::ErrorKind::WouldBlock {
                    Ok(sent)
                } else {
                    Err(e)
                };
            }
            sent += r as usize;
        }
        Ok(sent)
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
}
