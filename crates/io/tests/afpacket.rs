//! AF_PACKET ports on a real veth pair in a namespace of the test's own (needs root and
//! iproute2; skipped with a message when not root).

#![cfg(target_os = "linux")]

use flowstate_io::afpacket::{AfPacket, AfPacketOptions, Fanout, FanoutMode, RingVersion};
use flowstate_io::{PacketBatch, Port};
use flowstate_testkit::is_root;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().unwrap().success();
    assert!(ok, "ip {}", args.join(" "));
}

/// A namespace with a veth pair `fsa` <-> `fsb`, removed on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("fs-io{tag}{}", std::process::id() % 100_000);
        if std::path::Path::new("/run/netns").join(&name).exists() {
            ip(&["netns", "del", &name]);
        }
        ip(&["netns", "add", &name]);
        let ns = Ns(name);
        ip(&[
            "-n", &ns.0, "link", "add", "fsa", "type", "veth", "peer", "name", "fsb",
        ]);
        for dev in ["fsa", "fsb"] {
            // No IPv6 on the pair: a link coming up sends neighbour discovery and MLD frames
            // of its own, which took slots of the small rings the tests count on.
            let off = format!("net.ipv6.conf.{dev}.disable_ipv6=1");
            ip(&["netns", "exec", &ns.0, "sysctl", "-qw", &off]);
            ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        }
        // `link set up` returns before the kernel's link watch has activated the pair
        // (operstate, the transmit queue): frames sent in that window, with the qdisc
        // bypassed, can be lost. Wait until both ends say UP.
        let deadline = Instant::now() + Duration::from_secs(5);
        for dev in ["fsa", "fsb"] {
            loop {
                let out = Command::new("ip")
                    .args(["-n", &ns.0, "-o", "link", "show", "dev", dev])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                assert!(Instant::now() < deadline, "{dev} in {} never came up", ns.0);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        ns
    }

    /// Runs `f` on a thread inside the namespace (sockets it opens stay in it).
    fn within<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).unwrap();
                // SAFETY: switches this thread's network namespace only.
                let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// An Ethernet frame of `len` bytes: a made-up EtherType, `flow` in its first payload bytes.
fn frame(src: [u8; 6], flow: u16, seq: u16, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&src);
    // IPv4 so that the fanout hash sees a flow: addresses vary with `flow`.
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 253; // experimental protocol
    f[26..30].copy_from_slice(&[10, 9, (flow >> 8) as u8, flow as u8]);
    f[30..34].copy_from_slice(&[10, 8, 0, 1]);
    f[34..36].copy_from_slice(&flow.to_be_bytes());
    f[36..38].copy_from_slice(&seq.to_be_bytes());
    f
}

/// What `ports` receive until `want` frames came or `wait` passed.
fn drain(ports: &mut [&mut AfPacket], want: usize, wait: Duration) -> Vec<Vec<(u16, u16, usize)>> {
    let mut got: Vec<Vec<(u16, u16, usize)>> = vec![Vec::new(); ports.len()];
    let mut batch = PacketBatch::new(32, 2048);
    let deadline = Instant::now() + wait;
    while got.iter().map(Vec::len).sum::<usize>() < want && Instant::now() < deadline {
        for (i, p) in ports.iter_mut().enumerate() {
            batch.clear();
            p.recv_ready(&mut batch, i as u16, &mut |f| f.len() >= 38 && f[23] == 253)
                .unwrap();
            for (d, m) in batch.iter() {
                assert_eq!(m.port, i as u16);
                assert_eq!(m.wire_len as usize, d.len());
                assert!(m.timestamp_ns > 0);
                got[i].push((
                    u16::from_be_bytes([d[34], d[35]]),
                    u16::from_be_bytes([d[36], d[37]]),
                    d.len(),
                ));
            }
        }
        let fds: Vec<_> = ports.iter().filter_map(|p| p.raw_fd()).collect();
        flowstate_io::afpacket::wait_readable(&fds, Duration::from_millis(20)).unwrap();
    }
    got
}

#[test]
fn frames_sent_on_one_end_arrive_whole_and_in_order_on_the_other() {
    if !is_root() {
        eprintln!("skipped: AF_PACKET needs root");
        return;
    }
    let ns = Ns::new("o");
    ns.within(|| {
        let mut rx = AfPacket::open("fsb", &AfPacketOptions::default()).unwrap();
        let tx_opts = AfPacketOptions {
            receive: false,
            ..AfPacketOptions::default()
        };
        let mut tx = AfPacket::open("fsa", &tx_opts).unwrap();
        assert_eq!(tx.raw_fd(), None, "send-only");
        let src = tx.mac();
        let frames: Vec<Vec<u8>> = (0..500u16)
            .map(|i| frame(src, 1, i, 60 + usize::from(i) % 1400))
            .collect();
        let sent = tx.send(&mut frames.iter().map(Vec::as_slice)).unwrap();
        assert_eq!(sent, 500);
        let got = drain(&mut [&mut rx], 500, Duration::from_secs(10));
        let want: Vec<(u16, u16, usize)> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| (1, i as u16, f.len()))
            .collect();
        assert_eq!(got[0], want);

        // What a port sends is not received back on it.
        let mut both = AfPacket::open("fsa", &AfPacketOptions::default()).unwrap();
        both.send(&mut frames[..10].iter().map(Vec::as_slice))
            .unwrap();
        let echo = drain(&mut [&mut both], 1, Duration::from_millis(300));
        assert!(echo[0].is_empty(), "{echo:?}");
    });
}

/// A small ring, read while it is filled: the reader goes round it many times, on both ring
/// layouts, losing and reordering nothing; the sender bypasses the qdisc.
#[test]
fn both_ring_layouts_wrap_around_in_order() {
    if !is_root() {
        eprintln!("skipped: AF_PACKET needs root");
        return;
    }
    let ns = Ns::new("w");
    ns.within(|| {
        for ring in [RingVersion::V2, RingVersion::V3] {
            let opts = AfPacketOptions {
                ring,
                block_size: 4096,
                block_count: 4,
                frame_size: 2048,
                ..AfPacketOptions::default()
            };
            let mut rx = AfPacket::open("fsb", &opts).unwrap();
            let tx_opts = AfPacketOptions {
                receive: false,
                qdisc_bypass: true,
                ..AfPacketOptions::default()
            };
            let mut tx = AfPacket::open("fsa", &tx_opts).unwrap();
            let src = tx.mac();
            for round in 0..40u16 {
                let frames: Vec<Vec<u8>> = (0..6u16)
                    .map(|k| {
                        let seq = round * 6 + k;
                        frame(src, 2, seq, 60 + usize::from(seq * 37) % 1400)
                    })
                    .collect();
                assert_eq!(tx.send(&mut frames.iter().map(Vec::as_slice)).unwrap(), 6);
                let got = drain(&mut [&mut rx], 6, Duration::from_secs(5));
                let want: Vec<(u16, u16, usize)> = frames
                    .iter()
                    .enumerate()
                    .map(|(k, f)| (2, round * 6 + k as u16, f.len()))
                    .collect();
                assert_eq!(got[0], want, "{ring:?}, round {round}");
            }
        }
        // A slot size that is not a power of two is refused with a reason.
        let bad = AfPacketOptions {
            frame_size: 3000,
            ..AfPacketOptions::default()
        };
        let e = AfPacket::open("fsb", &bad).unwrap_err().to_string();
        assert!(e.contains("frame_size"), "{e}");
    });
}

#[test]
fn fanout_splits_by_flow_and_loses_nothing() {
    if !is_root() {
        eprintln!("skipped: AF_PACKET needs root");
        return;
    }
    let ns = Ns::new("f");
    ns.within(|| {
        let opts = AfPacketOptions {
            fanout: Some(Fanout {
                group: (std::process::id() & 0xffff) as u16,
                mode: FanoutMode::Hash,
            }),
            ..AfPacketOptions::default()
        };
        let mut r0 = AfPacket::open("fsb", &opts).unwrap();
        let mut r1 = AfPacket::open("fsb", &opts).unwrap();
        let mut tx = AfPacket::open(
            "fsa",
            &AfPacketOptions {
                receive: false,
                ..AfPacketOptions::default()
            },
        )
        .unwrap();
        let src = tx.mac();
        let frames: Vec<Vec<u8>> = (0..400u16).map(|i| frame(src, i % 40, i, 100)).collect();
        assert_eq!(tx.send(&mut frames.iter().map(Vec::as_slice)).unwrap(), 400);
        let got = drain(&mut [&mut r0, &mut r1], 400, Duration::from_secs(10));
        assert_eq!(got[0].len() + got[1].len(), 400, "nothing lost or doubled");
        for flow in 0..40u16 {
            let on: Vec<bool> = got.iter().map(|g| g.iter().any(|x| x.0 == flow)).collect();
            assert!(on[0] != on[1], "flow {flow} on exactly one socket");
        }
    });
}

#[test]
fn a_missing_interface_says_so() {
    let e = AfPacket::open("fs-nosuch0", &AfPacketOptions::default()).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("fs-nosuch0"), "{text}");
    assert!(
        text.contains("no such interface") || text.contains("CAP_NET_RAW"),
        "{text}"
    );
}

#[test]
fn af_xdp_receives_what_the_peer_sends_and_sends_back() {
    use flowstate_io::afxdp::{AfXdp, AfXdpOptions, XdpProgram};
    if !is_root() {
        eprintln!("skipped: AF_XDP needs root");
        return;
    }
    let ns = Ns::new("x");
    ns.within(|| {
        let program = XdpProgram::attach("fsb", 1).unwrap();
        let mut xsk = AfXdp::open("fsb", program, &AfXdpOptions::default()).unwrap();
        let mut peer = AfPacket::open("fsa", &AfPacketOptions::default()).unwrap();
        let src = peer.mac();
        // More frames than the fill ring holds: frames must be recycled.
        for round in 0..6u16 {
            let frames: Vec<Vec<u8>> = (0..500u16)
                .map(|i| frame(src, round, i, 60 + usize::from(i) % 1400))
                .collect();
            assert_eq!(
                peer.send(&mut frames.iter().map(Vec::as_slice)).unwrap(),
                500
            );
            let mut got = Vec::new();
            let mut batch = PacketBatch::new(32, 2048);
            let deadline = Instant::now() + Duration::from_secs(10);
            while got.len() < 500 && Instant::now() < deadline {
                batch.clear();
                xsk.recv_ready(&mut batch, 3, &mut |f| f.len() >= 38 && f[23] == 253)
                    .unwrap();
                for (d, m) in batch.iter() {
                    assert_eq!(m.port, 3);
                    got.push(d.to_vec());
                }
                flowstate_io::afpacket::wait_readable(
                    &[xsk.raw_fd().unwrap()],
                    Duration::from_millis(20),
                )
                .unwrap();
            }
            assert!(
                got == frames,
                "round {round}: {} of 500 frames, in order",
                got.len()
            );
        }
        // And back: 3000 frames through 2048 send frames, reclaimed as they complete.
        let mut back = 0;
        for round in 0..6u16 {
            let frames: Vec<Vec<u8>> = (0..500u16)
                .map(|i| frame(src, 100 + round, i, 200))
                .collect();
            let mut sent = 0;
            let deadline = Instant::now() + Duration::from_secs(10);
            while sent < 500 && Instant::now() < deadline {
                sent += xsk
                    .send(&mut frames[sent..].iter().map(Vec::as_slice))
                    .unwrap();
                if sent < 500 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            assert_eq!(sent, 500);
            back += drain(&mut [&mut peer], 500, Duration::from_secs(10))[0].len();
        }
        assert_eq!(back, 3000);
    });
}

#[test]
fn interfaces_and_addresses_are_found_and_missing_ones_are_not() {
    use flowstate_io::afpacket::{address_assigned, interface_exists};
    assert!(interface_exists("lo"));
    assert!(!interface_exists("fs-no-such-if"));
    assert!(!interface_exists("bad\0name"));
    assert_eq!(address_assigned("127.0.0.1".parse().unwrap()), Some(true));
    assert_eq!(
        address_assigned("192.0.2.254".parse().unwrap()),
        Some(false)
    );
}
