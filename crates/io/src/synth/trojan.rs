//! The `trojan` profile: CHC's trojan signature (§2.1 R4, Fig. 2) among normal hosts, as whole
//! TCP connections with real application payloads, and its ground truth.
//!
//! `flows` is the number of **inside hosts** (clients in `clients_v4`, IPv4 only); one in ten
//! (at least one) is infected, chosen by the seed ([`infected`]). `packets` is not used: the
//! trace has as many packets as its sessions take ([`super::Synthetic::total_packets`]).
//!
//! * An **infected** host opens an SSH connection (banners `SSH-2.0-…` both ways), then
//!   downloads a file over FTP (control connection to port 21: `220`, `USER`/`331`,
//!   `PASS`/`230`, `TYPE I`/`200`, `PASV`/`227 Entering Passive Mode (h1,h2,h3,h4,p1,p2)`, the
//!   data connection to that port, `RETR name.zip|.exe|.html|.bin`/`150`, the file with its
//!   magic bytes (`PK\x03\x04`, `MZ`, `<!DOCTYPE html>`; a `.bin` is an EXE under another
//!   name) on the data connection, `226`,
//!   `QUIT`/`221`), then joins IRC on 6667 (`NICK`, `USER`, the server's `001`, `JOIN #chan`
//!   and its echo). Each step starts after the previous one ended.
//! * A **normal** host does ordinary web requests (HTTP/1.1 on port 80) and one of: nothing
//!   else, SSH only, FTP only, IRC only, the three in another order (IRC → FTP → SSH, FTP → SSH
//!   → IRC, SSH → IRC → FTP), or SSH → FTP of a `.txt` file → IRC. None of them is the
//!   signature.
//!
//! Timestamps follow the sessions' own timeline from `start_ns` (`rate_pps` is not used): a
//! session's packets are 1 ms apart, a host's steps 2 s apart, and hosts start within the
//! first 8 s. Hosts' sessions interleave in time; a host's own steps are seconds apart, so arrival order
//! is the order of the steps. Segments carry no TCP options besides MSS on the handshake;
//! sequence and acknowledgment numbers are exact.

use super::{Ipv4Net, SynthConfig, CLIENT_MAC, SERVER_MAC};
use crate::{Error, Result};
use flowstate_wire::build::{
    tcp_flags, EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, TcpOptions, TcpSpec,
    ETHERNET_MIN_LEN,
};
use std::net::{IpAddr, Ipv4Addr};

/// Most payload bytes in one segment.
const MSS: usize = 1400;
/// Time between a session's packets, ns.
const GAP_NS: u64 = 1_000_000;
/// Time between a host's steps, ns.
const STEP_NS: u64 = 2_000_000_000;

/// A generated frame: its time and its bytes.
pub(crate) type Frame = (u64, Vec<u8>);

/// Checks the options the profile uses.
pub(crate) fn validate(c: &SynthConfig) -> Result<()> {
    let usable = host_count(c.clients_v4);
    if c.flows == 0 || c.flows > usable {
        return Err(Error::Option {
            name: "flows",
            reason: format!(
                "profile trojan: flows is the number of inside hosts, 1 to {usable} in {}",
                c.clients_v4
            ),
        });
    }
    if host_count(c.servers_v4) < 100 {
        return Err(Error::Option {
            name: "subnet",
            reason: format!(
                "profile trojan needs a server subnet of at least 100 hosts, got {}",
                c.servers_v4
            ),
        });
    }
    Ok(())
}

fn host_count(n: Ipv4Net) -> u64 {
    let bits = 32 - u32::from(n.prefix_len());
    if bits < 2 {
        0
    } else {
        (1u64 << bits).saturating_sub(2).min(1 << 20)
    }
}

fn nth(n: Ipv4Net, i: u64) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(n.network()).wrapping_add(1 + i as u32))
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether host `i` of `c` is infected.
fn is_infected(c: &SynthConfig, i: u64) -> bool {
    let n = c.flows;
    let k = (n / 10).max(1);
    // The k hosts with the smallest keyed hash.
    let key = |j: u64| (mix(c.seed ^ 0x7472_6f6a_616e ^ mix(j)), j);
    let mine = key(i);
    (0..n).filter(|&j| key(j) < mine).count() < k as usize
}

/// The infected hosts of the trace `c` makes (its ground truth), in address order.
pub fn infected(c: &SynthConfig) -> Vec<IpAddr> {
    (0..c.flows)
        .filter(|&i| is_infected(c, i))
        .map(|i| IpAddr::V4(nth(c.clients_v4, i)))
        .collect()
}

// ------------------------------------------------------------------------------------------
// Connections

/// One TCP connection being scripted.
struct Conn {
    client: (Ipv4Addr, u16),
    server: (Ipv4Addr, u16),
    /// Next sequence numbers.
    cseq: u32,
    sseq: u32,
}

/// Writes frames of one host's steps, in time.
struct Writer {
    t: u64,
    frames: Vec<Frame>,
    ip_id: u16,
}

impl Writer {
    fn frame(&mut self, c: &Conn, from_client: bool, flags: u8, data: &[u8], syn: bool) {
        let (src, dst) = if from_client {
            (c.client, c.server)
        } else {
            (c.server, c.client)
        };
        let (seq, ack) = if from_client {
            (c.cseq, c.sseq)
        } else {
            (c.sseq, c.cseq)
        };
        let (smac, dmac) = if from_client {
            (CLIENT_MAC, SERVER_MAC)
        } else {
            (SERVER_MAC, CLIENT_MAC)
        };
        let mut ip = Ipv4Spec::new(src.0, dst.0);
        ip.id = self.ip_id;
        ip.dont_fragment = true;
        self.ip_id = self.ip_id.wrapping_add(1);
        let spec = FrameSpec {
            ethernet: EthernetSpec::new(smac, dmac),
            ip: IpSpec::V4(ip),
            l4: L4Spec::Tcp(TcpSpec {
                src_port: src.1,
                dst_port: dst.1,
                seq,
                ack: if flags & tcp_flags::ACK != 0 { ack } else { 0 },
                flags,
                window: 64_240,
                urgent: 0,
                options: if syn {
                    TcpOptions {
                        mss: Some(1460),
                        ..TcpOptions::NONE
                    }
                } else {
                    TcpOptions::NONE
                },
            }),
            payload: Payload::Bytes(data),
            min_len: ETHERNET_MIN_LEN,
        };
        let mut buf = vec![0u8; spec.frame_len()];
        // The buffer is the frame's length and payloads are at most MSS bytes.
        if let Ok(n) = spec.write(&mut buf) {
            buf.truncate(n);
            self.frames.push((self.t, buf));
        }
        self.t += GAP_NS;
    }

    fn open(&mut self, client: (Ipv4Addr, u16), server: (Ipv4Addr, u16), isn: u64) -> Conn {
        let mut c = Conn {
            client,
            server,
            cseq: isn as u32,
            sseq: (isn >> 32) as u32,
        };
        self.frame(&c, true, tcp_flags::SYN, b"", true);
        c.cseq = c.cseq.wrapping_add(1);
        self.frame(&c, false, tcp_flags::SYN | tcp_flags::ACK, b"", true);
        c.sseq = c.sseq.wrapping_add(1);
        self.frame(&c, true, tcp_flags::ACK, b"", false);
        c
    }

    /// Sends `data` in MSS-sized segments, each acknowledged.
    fn send(&mut self, c: &mut Conn, from_client: bool, data: &[u8]) {
        for chunk in data.chunks(MSS) {
            self.frame(
                c,
                from_client,
                tcp_flags::PSH | tcp_flags::ACK,
                chunk,
                false,
            );
            if from_client {
                c.cseq = c.cseq.wrapping_add(chunk.len() as u32);
            } else {
                c.sseq = c.sseq.wrapping_add(chunk.len() as u32);
            }
            self.frame(c, !from_client, tcp_flags::ACK, b"", false);
        }
    }

    /// FIN from `from_client`'s side first, answered, both acknowledged.
    fn close(&mut self, mut c: Conn, from_client: bool) {
        let fin = tcp_flags::FIN | tcp_flags::ACK;
        self.frame(&c, from_client, fin, b"", false);
        bump(&mut c, from_client);
        self.frame(&c, !from_client, fin, b"", false);
        bump(&mut c, !from_client);
        self.frame(&c, from_client, tcp_flags::ACK, b"", false);
    }
}

fn bump(c: &mut Conn, client: bool) {
    if client {
        c.cseq = c.cseq.wrapping_add(1);
    } else {
        c.sseq = c.sseq.wrapping_add(1);
    }
}

// ------------------------------------------------------------------------------------------
// Sessions

#[derive(Clone, Copy)]
enum Step {
    Web,
    Ssh,
    Ftp(&'static str),
    Irc,
}

struct Host<'a> {
    w: Writer,
    addr: Ipv4Addr,
    port: u16,
    rng: u64,
    servers: &'a Servers,
}

struct Servers {
    web: Ipv4Addr,
    ssh: Ipv4Addr,
    ftp: Ipv4Addr,
    irc: Ipv4Addr,
}

impl Host<'_> {
    fn next(&mut self) -> u64 {
        self.rng = mix(self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
        self.rng
    }

    fn client(&mut self) -> (Ipv4Addr, u16) {
        self.port = if self.port >= 60_999 {
            32_768
        } else {
            self.port + 1
        };
        (self.addr, self.port)
    }

    fn step(&mut self, s: Step) {
        let isn = self.next();
        match s {
            Step::Web => {
                let me = self.client();
                let mut c = self.w.open(me, (self.servers.web, 80), isn);
                let req = b"GET /index.html HTTP/1.1\r\nHost: www.example.com\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";
                self.w.send(&mut c, true, req);
                let body = html(40);
                let mut resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                resp.extend_from_slice(&body);
                self.w.send(&mut c, false, &resp);
                self.w.close(c, true);
            }
            Step::Ssh => {
                let me = self.client();
                let mut c = self.w.open(me, (self.servers.ssh, 22), isn);
                self.w
                    .send(&mut c, false, b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n");
                self.w.send(&mut c, true, b"SSH-2.0-OpenSSH_9.6\r\n");
                self.w.close(c, true);
            }
            Step::Ftp(name) => self.ftp(name, isn),
            Step::Irc => {
                let me = self.client();
                let mut c = self.w.open(me, (self.servers.irc, 6667), isn);
                let nick = format!("u{}", self.next() % 100_000);
                self.w.send(
                    &mut c,
                    true,
                    format!("NICK {nick}\r\nUSER {nick} 0 * :{nick}\r\n").as_bytes(),
                );
                self.w.send(
                    &mut c,
                    false,
                    format!(":irc.example.net 001 {nick} :Welcome to the Internet Relay Network {nick}\r\n").as_bytes(),
                );
                self.w.send(&mut c, true, b"JOIN #chan\r\n");
                self.w.send(
                    &mut c,
                    false,
                    format!(":{nick}!{nick}@{} JOIN #chan\r\n", self.addr).as_bytes(),
                );
                self.w.send(&mut c, true, b"QUIT :bye\r\n");
                self.w.send(&mut c, false, b"ERROR :Closing Link\r\n");
                self.w.close(c, false);
            }
        }
    }

    fn ftp(&mut self, name: &str, isn: u64) {
        let me = self.client();
        let server = self.servers.ftp;
        let mut c = self.w.open(me, (server, 21), isn);
        let w = &mut self.w;
        w.send(&mut c, false, b"220 (vsFTPd 3.0.3)\r\n");
        w.send(&mut c, true, b"USER anonymous\r\n");
        w.send(&mut c, false, b"331 Please specify the password.\r\n");
        w.send(&mut c, true, b"PASS guest@\r\n");
        w.send(&mut c, false, b"230 Login successful.\r\n");
        w.send(&mut c, true, b"TYPE I\r\n");
        w.send(&mut c, false, b"200 Switching to Binary mode.\r\n");
        w.send(&mut c, true, b"PASV\r\n");
        let data_port: u16 = 40_000 + (isn % 10_000) as u16;
        let o = server.octets();
        let reply = format!(
            "227 Entering Passive Mode ({},{},{},{},{},{}).\r\n",
            o[0],
            o[1],
            o[2],
            o[3],
            data_port >> 8,
            data_port & 0xff
        );
        w.send(&mut c, false, reply.as_bytes());
        let content = file(name);
        let dme = self.client();
        let dport = self.next();
        let w = &mut self.w;
        let mut d = w.open(dme, (server, data_port), dport);
        w.send(&mut c, true, format!("RETR {name}\r\n").as_bytes());
        w.send(
            &mut c,
            false,
            format!(
                "150 Opening BINARY mode data connection for {name} ({} bytes).\r\n",
                content.len()
            )
            .as_bytes(),
        );
        w.send(&mut d, false, &content);
        w.close(d, false);
        w.send(&mut c, false, b"226 Transfer complete.\r\n");
        w.send(&mut c, true, b"QUIT\r\n");
        w.send(&mut c, false, b"221 Goodbye.\r\n");
        w.close(c, false);
    }
}

fn html(lines: usize) -> Vec<u8> {
    let mut s = String::from("<!DOCTYPE html>\n<html><head><title>example</title></head><body>\n");
    for i in 0..lines {
        s.push_str(&format!("<p>paragraph {i} of an ordinary page</p>\n"));
    }
    s.push_str("</body></html>\n");
    s.into_bytes()
}

/// A file's content, with the magic bytes its name's type has.
fn file(name: &str) -> Vec<u8> {
    let mut v: Vec<u8> = if name.ends_with(".zip") {
        let mut z = b"PK\x03\x04\x14\x00\x00\x00\x00\x00".to_vec();
        z.resize(30, 0);
        z
    } else if name.ends_with(".exe") || name.ends_with(".bin") {
        let mut m = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff".to_vec();
        m.resize(64, 0);
        m
    } else if name.ends_with(".html") {
        return html(60);
    } else {
        b"plain notes\n".repeat(20)
    };
    v.extend((0..2_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8));
    v
}

/// Every frame of the trace `c` describes (after [`validate`]), in time order.
pub(crate) fn frames(c: &SynthConfig) -> Vec<Frame> {
    let servers = Servers {
        web: nth(c.servers_v4, 79),
        ssh: nth(c.servers_v4, 21),
        ftp: nth(c.servers_v4, 20),
        irc: nth(c.servers_v4, 66),
    };
    let mut all: Vec<(u64, u64, usize, Vec<u8>)> = Vec::new();
    for i in 0..c.flows {
        let seed = mix(c.seed ^ mix(i ^ 0x5eed));
        let mut h = Host {
            w: Writer {
                t: seed % (STEP_NS * 4),
                frames: Vec::new(),
                ip_id: seed as u16,
            },
            addr: nth(c.clients_v4, i),
            port: 32_768 + (seed >> 16) as u16 % 20_000,
            rng: seed,
            servers: &servers,
        };
        let steps: Vec<Step> = if is_infected(c, i) {
            // `patch.bin` is an EXE under another name: only its content (the data
            // connection's magic bytes) says so.
            let file = ["update.zip", "setup.exe", "index.html", "patch.bin"][(seed % 4) as usize];
            vec![Step::Web, Step::Ssh, Step::Ftp(file), Step::Irc, Step::Web]
        } else {
            match h.next() % 10 {
                0 | 1 => vec![Step::Web, Step::Web],
                2 => vec![Step::Ssh, Step::Web],
                3 => vec![Step::Web, Step::Ftp("report.zip")],
                4 => vec![Step::Irc, Step::Web],
                5 => vec![Step::Irc, Step::Ftp("tool.exe"), Step::Ssh],
                6 => vec![Step::Ftp("page.html"), Step::Ssh, Step::Irc],
                7 => vec![Step::Ssh, Step::Irc, Step::Ftp("a.zip")],
                8 => vec![Step::Ssh, Step::Ftp("notes.txt"), Step::Irc],
                _ => vec![Step::Web, Step::Ssh, Step::Web],
            }
        };
        for s in steps {
            h.step(s);
            h.w.t += STEP_NS;
        }
        for (k, (t, f)) in h.w.frames.into_iter().enumerate() {
            all.push((t, i, k, f));
        }
    }
    all.sort_by_key(|(t, i, k, _)| (*t, *i, *k));
    all.into_iter()
        .map(|(t, _, _, f)| (c.start_ns.saturating_add(t), f))
        .collect()
}
