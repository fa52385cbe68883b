//! The trojan detector on hand-built packets (order, logical clocks, split commands, expiry,
//! configuration errors, garbage) and on the `trojan` synthetic profile (every infected host
//! of the ground truth found, no normal host flagged, with one worker, with two workers split
//! by the NF's partition, and with packets delivered out of order under logical clocks).

use flowstate_io::synth::{infected, Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, Source};
use flowstate_nf::trojan::{Config, Factory, Trojan};
use flowstate_nf::{BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{Partition, StateConfig};
use flowstate_testkit::tcp4;
use flowstate_wire::dissect;
use std::net::{IpAddr, Ipv4Addr};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;
const SEC: u64 = 1_000_000_000;

const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 7);
const SSH: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 22), 22);
const FTP: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 21), 21);
const IRC: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 67), 6667);
const WEB: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 80), 80);

fn frame(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    tcp4(src, dst, seq, 1, flags, data)
}

/// A detector on its own local store, with a virtual clock.
struct Det {
    _part: Partition,
    nf: Box<dyn NetworkFunction>,
    now: u64,
}

impl Det {
    fn new(toml: &str) -> Det {
        Det::on(toml, StateConfig::default())
    }

    fn on(toml: &str, sc: StateConfig) -> Det {
        let table: toml::Table = toml.parse().expect("toml");
        let f = flowstate_nf::registry::factory("trojan", &table).expect("config");
        let mut part = Partition::new(&LocalStore::new(), sc).expect("partition");
        let nf = f
            .build(
                &mut part.declare("trojan"),
                flowstate_nf::Placement {
                    partition: 0,
                    partitions: 1,
                    stage: 0,
                },
            )
            .expect("build");
        Det {
            _part: part,
            nf,
            now: 1_700_000_000 * SEC,
        }
    }

    /// Feeds a frame at the current time with logical clock `clock`.
    fn feed(&mut self, mut f: Vec<u8>, clock: u64) -> Verdict {
        let d = match dissect(&f) {
            Ok(d) => d,
            Err(_) => return Verdict::Forward,
        };
        let inside = matches!(d.flow.map(|k| k.src), Some(IpAddr::V4(a)) if a.octets()[0] == 10);
        let mut pkt = Packet {
            data: &mut f,
            dissection: d,
            direction: if inside {
                Direction::Outbound
            } else {
                Direction::Inbound
            },
        };
        self.now += 1_000_000;
        let cx = Context {
            now: self.now,
            clock,
            partition: 0,
        };
        let v = self.nf.process(&mut pkt, &cx);
        self.nf.on_tick(self.now);
        v
    }

    fn alerts(&self) -> i64 {
        self.nf
            .report()
            .iter()
            .find(|(k, _)| *k == "alerts")
            .map(|(_, v)| *v)
            .expect("alerts reported")
    }
}

/// A client port per connection.
fn me(port: u16) -> (Ipv4Addr, u16) {
    (HOST, port)
}

/// The packets of an event: a SYN, or a command line on an established stream.
fn ssh(port: u16) -> Vec<Vec<u8>> {
    vec![frame(me(port), SSH, 100, SYN, b"")]
}
fn irc(port: u16) -> Vec<Vec<u8>> {
    vec![frame(me(port), IRC, 100, SYN, b"")]
}
fn retr(port: u16, name: &str) -> Vec<Vec<u8>> {
    vec![
        frame(me(port), FTP, 100, SYN, b""),
        frame(
            me(port),
            FTP,
            101,
            PSH | ACK,
            format!("RETR {name}\r\n").as_bytes(),
        ),
    ]
}

fn run(d: &mut Det, events: Vec<Vec<Vec<u8>>>) {
    for e in events {
        for f in e {
            assert_eq!(d.feed(f, 0), Verdict::Forward);
        }
    }
}

#[test]
fn the_sequence_alerts_once() {
    let mut d = Det::new("");
    run(
        &mut d,
        vec![ssh(40001), retr(40002, "x.zip"), irc(40003), irc(40004)],
    );
    assert_eq!(d.alerts(), 1);
    // More activity of the same sequence does not alert again; a new sequence does.
    run(&mut d, vec![irc(40005), retr(40006, "y.exe")]);
    assert_eq!(d.alerts(), 1);
    run(&mut d, vec![ssh(40007), retr(40008, "y.exe"), irc(40009)]);
    assert_eq!(d.alerts(), 2);
}

#[test]
fn other_orders_incomplete_and_other_files_do_not_alert() {
    for (name, events) in [
        ("ftp ssh irc", vec![retr(1, "a.zip"), ssh(2), irc(3)]),
        ("irc ftp ssh", vec![irc(1), retr(2, "a.zip"), ssh(3)]),
        ("ssh irc ftp", vec![ssh(1), irc(2), retr(3, "a.zip")]),
        ("ssh ftp", vec![ssh(1), retr(2, "a.exe")]),
        ("ssh irc", vec![ssh(1), irc(2)]),
        ("ftp irc", vec![retr(1, "a.html"), irc(2)]),
        ("txt", vec![ssh(1), retr(2, "a.txt"), irc(3)]),
        (
            "zip in a dir name",
            vec![ssh(1), retr(2, "a.zip/readme"), irc(3)],
        ),
    ] {
        let mut d = Det::new("");
        run(&mut d, events);
        assert_eq!(d.alerts(), 0, "{name}");
    }
    // An HTTP download of a zip is not FTP.
    let mut d = Det::new("");
    run(
        &mut d,
        vec![
            ssh(1),
            vec![
                frame(me(2), WEB, 100, SYN, b""),
                frame(me(2), WEB, 101, PSH | ACK, b"RETR a.zip\r\n"),
            ],
            irc(3),
        ],
    );
    assert_eq!(d.alerts(), 0);
}

#[test]
fn payload_events_count_on_any_port() {
    // The SSH banner and IRC commands on unusual ports.
    let mut d = Det::new("");
    let alt_ssh = (SSH.0, 2222);
    let alt_irc = (IRC.0, 7000);
    run(
        &mut d,
        vec![
            vec![
                frame(me(40001), alt_ssh, 100, SYN, b""),
                frame(
                    me(40001),
                    alt_ssh,
                    101,
                    PSH | ACK,
                    b"SSH-2.0-OpenSSH_9.6\r\n",
                ),
            ],
            retr(40002, "a.zip"),
            vec![
                frame(me(40003), alt_irc, 100, SYN, b""),
                frame(me(40003), alt_irc, 101, PSH | ACK, b"NICK bot\r\n"),
            ],
        ],
    );
    assert_eq!(d.alerts(), 1);
}

#[test]
fn irc_words_in_a_web_page_are_not_irc() {
    // A server's response (the lower port sends it) with lines that read like IRC commands.
    let mut d = Det::new("");
    run(&mut d, vec![ssh(40001), retr(40002, "a.zip")]);
    d.feed(frame(me(40003), WEB, 100, SYN, b""), 0);
    d.feed(frame(WEB, me(40003), 500, SYN | ACK, b""), 0);
    d.feed(
        frame(
            WEB,
            me(40003),
            501,
            PSH | ACK,
            b"HTTP/1.1 200 OK\r\n\r\nJOIN orders ON x\nNICK y\n",
        ),
        0,
    );
    assert_eq!(d.alerts(), 0);
    // A client that sends them deep into a long upload does not count either.
    let mut body = vec![b'a'; 1100];
    body.extend_from_slice(b"\nJOIN #c\n");
    d.feed(frame(me(40004), WEB, 100, SYN, b""), 0);
    d.feed(frame(me(40004), WEB, 101, PSH | ACK, &body), 0);
    assert_eq!(d.alerts(), 0);
}

/// A passive FTP download: `PASV`/`227` on the control connection, then the server's data
/// connection carries `content`; the file's name is `name`.
fn pasv_download(port: u16, name: &str, content: &[u8], reply: bool) -> Vec<Vec<u8>> {
    let data = (FTP.0, 40_100);
    let mut v = vec![
        frame(me(port), FTP, 100, SYN, b""),
        frame(FTP, me(port), 900, SYN | ACK, b""),
        frame(me(port), FTP, 101, PSH | ACK, b"PASV\r\n"),
    ];
    if reply {
        v.push(frame(
            FTP,
            me(port),
            901,
            PSH | ACK,
            b"227 Entering Passive Mode (198,51,100,21,156,164).\r\n",
        ));
    }
    v.extend([
        frame(me(port + 1), data, 500, SYN, b""),
        frame(data, me(port + 1), 7000, SYN | ACK, b""),
        frame(
            me(port),
            FTP,
            107,
            PSH | ACK,
            format!("RETR {name}\r\n").as_bytes(),
        ),
        frame(data, me(port + 1), 7001, PSH | ACK, content),
    ]);
    v
}

#[test]
fn the_data_connection_content_counts_whatever_the_name() {
    for (content, reply, want) in [
        (&b"MZ\x90\x00\x03 an exe"[..], true, 1),
        (b"PK\x03\x04 a zip", true, 1),
        (b"<!doctype html><html></html>", true, 1),
        (b"plain text", true, 0),
        // No 227: the data connection was not announced.
        (b"MZ\x90\x00\x03 an exe", false, 0),
    ] {
        let mut d = Det::new("");
        run(
            &mut d,
            vec![
                ssh(40001),
                pasv_download(40010, "update.bin", content, reply),
                irc(40020),
            ],
        );
        assert_eq!(d.alerts(), want, "{content:?}, 227: {reply}");
    }
}

#[test]
fn a_file_ahead_of_its_announcement_counts_at_its_own_clock() {
    // The data connection (clocks 6-7) overtakes the control connection's 227 (clock 5), as
    // through a faster upstream path; the IRC comes at 10.
    let frames = pasv_download(40010, "update.bin", b"MZ\x90\x00\x03 an exe", true);
    let (control, data) = frames.split_at(4);
    let mut d = Det::new("");
    for f in ssh(40001) {
        d.feed(f, 1);
    }
    for (k, f) in data.iter().enumerate() {
        d.feed(f.clone(), 6 + k as u64);
    }
    for (k, f) in control.iter().enumerate() {
        d.feed(f.clone(), 2 + k as u64);
    }
    assert_eq!(d.alerts(), 0);
    for f in irc(40020) {
        d.feed(f, 10);
    }
    assert_eq!(d.alerts(), 1);
    // With the IRC before the file, in clock order, nothing.
    let mut d = Det::new("");
    for f in ssh(40001) {
        d.feed(f, 1);
    }
    for f in irc(40020) {
        d.feed(f, 5);
    }
    for (k, f) in data.iter().enumerate() {
        d.feed(f.clone(), 6 + k as u64);
    }
    for (k, f) in control.iter().enumerate() {
        d.feed(f.clone(), 2 + k as u64);
    }
    assert_eq!(d.alerts(), 0);
}

#[test]
fn a_command_split_across_segments_counts() {
    let mut d = Det::new("");
    run(&mut d, vec![ssh(1)]);
    d.feed(frame(me(2), FTP, 100, SYN, b""), 0);
    d.feed(
        frame(me(2), FTP, 101, PSH | ACK, b"USER anonymous\r\nRE"),
        0,
    );
    d.feed(frame(me(2), FTP, 119, PSH | ACK, b"TR sec"), 0);
    // Out of order: the end of the line before its middle.
    d.feed(frame(me(2), FTP, 131, PSH | ACK, b".zip\r\n"), 0);
    d.feed(frame(me(2), FTP, 125, PSH | ACK, b"ret/a"), 0);
    d.feed(frame(me(2), FTP, 130, PSH | ACK, b"b"), 0);
    run(&mut d, vec![irc(3)]);
    assert_eq!(d.alerts(), 1);
}

#[test]
fn logical_clocks_order_events_whatever_their_arrival() {
    // (kind, clock) in arrival order; alerts exactly when the clocks give SSH < FTP < IRC.
    type Ev = (&'static str, u64);
    let cases: &[(&[Ev], i64)] = &[
        (&[("ssh", 10), ("irc", 30), ("ftp", 20)], 1), // FTP late, but before the IRC
        (&[("irc", 30), ("ftp", 20), ("ssh", 10)], 1), // all backwards
        (&[("ftp", 20), ("irc", 30), ("ssh", 10)], 1),
        (&[("ssh", 10), ("irc", 30), ("ftp", 40)], 0), // FTP after the IRC
        (&[("ssh", 25), ("ftp", 20), ("irc", 30)], 0), // SSH after the FTP
        (&[("irc", 5), ("ssh", 10), ("ftp", 20)], 0),
        (&[("ftp", 20), ("ssh", 30), ("irc", 40)], 0), // arrival order would say ftp first too
        (&[("ssh", 30), ("ftp", 40), ("irc", 50), ("ssh", 10)], 1),
    ];
    for (i, (events, want)) in cases.iter().enumerate() {
        let mut d = Det::new("");
        for (k, (kind, clock)) in events.iter().enumerate() {
            let port = 1000 + k as u16;
            let fs = match *kind {
                "ssh" => ssh(port),
                "ftp" => retr(port, "a.zip"),
                _ => irc(port),
            };
            // Every packet of an event carries its clock (a connection's packets are close).
            for f in fs {
                d.feed(f, *clock);
            }
        }
        assert_eq!(d.alerts(), *want, "case {i}: {events:?}");
    }
    // In arrival order the same packets (no clocks) say otherwise.
    let mut d = Det::new("");
    run(&mut d, vec![ssh(1), irc(2), retr(3, "a.zip")]);
    assert_eq!(d.alerts(), 0);
}

#[test]
fn expiry_forgets_an_old_sequence() {
    let mut d = Det::new("window = \"60s\"");
    run(&mut d, vec![ssh(1), retr(2, "a.zip")]);
    d.now += 61 * SEC;
    d.nf.on_tick(d.now);
    assert_eq!(
        d.nf.report()
            .iter()
            .find(|(k, _)| *k == "hosts")
            .map(|x| x.1),
        Some(0),
        "the host's state expired"
    );
    run(&mut d, vec![irc(3)]);
    assert_eq!(d.alerts(), 0);
    // Within the window it alerts.
    run(&mut d, vec![ssh(4), retr(5, "a.zip")]);
    d.now += 59 * SEC;
    run(&mut d, vec![irc(6)]);
    assert_eq!(d.alerts(), 1);
    // Stale events are dropped even before a tick expires the entry: SSH at t, FTP at t + 40,
    // IRC at t + 80 (the SSH is older than the window by then).
    let mut d = Det::new("window = \"60s\"");
    run(&mut d, vec![ssh(1)]);
    d.now += 40 * SEC;
    run(&mut d, vec![retr(2, "a.zip")]);
    d.now += 40 * SEC;
    run(&mut d, vec![irc(3)]);
    assert_eq!(d.alerts(), 0);
}

#[test]
fn configuration_errors_name_the_key() {
    for (toml, key) in [
        ("window = -1", "window"),
        ("window = 3600", "window"),
        ("window = \"0s\"", "window"),
        ("ssh_ports = [70000]", "ssh_ports[0]"),
        ("irc_ports = \"6667\"", "irc_ports"),
        ("extensions = [\".zip\"]", "extensions"),
        ("extensions = [1]", "extensions[0]"),
        ("reassembly = { timeout = \"0s\" }", "reassembly.timeout"),
        ("reassembly = { timeout = 600 }", "reassembly.timeout"),
        ("reassembly = { color = 1 }", "reassembly.color"),
        ("windw = 3", "windw"),
    ] {
        let table: toml::Table = toml.parse().unwrap();
        match flowstate_nf::registry::factory("trojan", &table) {
            Err(BuildError::Config { nf, key: k, reason }) => {
                assert_eq!((nf, k.as_str()), ("trojan", key), "{toml}: {reason}");
                if key == "windw" {
                    assert!(reason.contains("windw"), "{reason}");
                }
            }
            Err(e) => panic!("{toml}: {e}"),
            Ok(_) => panic!("{toml}: accepted"),
        }
    }
    let ok: toml::Table =
        "window = \"600s\"\nssh_ports = [22, 2222]\nextensions = [\"zip\", \"EXE\"]"
            .parse()
            .unwrap();
    assert!(flowstate_nf::registry::factory("trojan", &ok).is_ok());
    assert!(!Factory(Config::default()).fast_path());
}

#[test]
fn garbage_never_panics() {
    let mut d = Det::new("");
    let mut x = 0x1234_5678_9abc_def0u64;
    let base = frame(me(1), FTP, 100, PSH | ACK, b"RETR a.zip\r\n");
    for i in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut f = base.clone();
        // Flip bytes anywhere, truncate, or send random bytes.
        match i % 3 {
            0 => {
                let k = (x as usize) % f.len();
                f[k] ^= (x >> 32) as u8;
                let j = (x >> 40) as usize % f.len();
                f[j] = (x >> 48) as u8;
            }
            1 => f.truncate((x as usize) % f.len()),
            _ => {
                f = (0..(x % 200) as usize)
                    .map(|j| (x >> (j % 8 * 8)) as u8)
                    .collect()
            }
        }
        assert_eq!(d.feed(f, x % 3), Verdict::Forward);
    }
}

// ------------------------------------------------------------------------------------------
// The `trojan` profile

fn trace(hosts: u64, seed: u64) -> (Vec<Vec<u8>>, Vec<IpAddr>) {
    let cfg = SynthConfig {
        flows: hosts,
        seed,
        ..SynthConfig::new(Profile::Trojan)
    };
    let truth = infected(&cfg);
    let mut s = Synthetic::new(cfg).expect("valid");
    let mut b = PacketBatch::new(64, 2048);
    let mut out = Vec::new();
    while s.recv(&mut b).expect("recv") > 0 {
        out.extend(b.iter().map(|(d, _)| d.to_vec()));
    }
    (out, truth)
}

#[test]
fn profile_every_infected_host_found_and_no_normal_host_flagged() {
    for (hosts, seed) in [(50, 1), (120, 7)] {
        let (frames, truth) = trace(hosts, seed);
        assert!(!truth.is_empty());
        let found = detect_concrete(frames.iter().cloned().map(|f| (0, f)).collect(), 1);
        assert_eq!(found, truth, "{hosts} hosts, seed {seed}");
        let found = detect_concrete(frames.iter().cloned().map(|f| (0, f)).collect(), 2);
        assert_eq!(found, truth, "two workers");
    }
}

#[test]
fn profile_out_of_order_with_logical_clocks() {
    // CHC §5.2: packets reach the detector through three upstream instances (a flow always
    // through the same one), each first in, first out but with its own, varying delay (up to
    // 300 packets), so flows overtake each other. Clocks are stamped at the chain's input.
    let (frames, truth) = trace(80, 3);
    let mut last = [0u64; 3];
    let mut delivered: Vec<(u64, u64, Vec<u8>)> = frames
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let flow = dissect(&f).ok().and_then(|d| d.flow).expect("flow");
            let k = (flowstate_wire::hash::crc32c(format!("{:?}", flow.canonical()).as_bytes()) % 3)
                as usize;
            let mut z = (i as u64 / 50 + 1 + k as u64 * 1000).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z ^= z >> 29;
            let at = (i as u64 + z % 300).max(last[k]);
            last[k] = at;
            (at, i as u64 + 1, f)
        })
        .collect();
    delivered.sort_by_key(|(at, clock, _)| (*at, *clock));
    let moved = delivered.windows(2).filter(|w| w[0].1 > w[1].1).count();
    assert!(moved > 100, "the delivery is reordered ({moved})");
    let found = detect_concrete(delivered.into_iter().map(|(_, c, f)| (c, f)).collect(), 2);
    assert_eq!(found, truth);
    // (A host's steps are seconds apart, so this jitter alone does not fool arrival order
    // either; `profile_slow_ftp_path_needs_the_clocks` is the case that does.)
}

/// Runs `frames` (with their logical clocks) through `workers` detectors, each packet to the
/// worker the NF's partition names; returns the hosts alerted on.
fn detect_concrete(frames: Vec<(u64, Vec<u8>)>, workers: u32) -> Vec<IpAddr> {
    let factory = Factory(Config::default());
    let mut parts: Vec<Partition> = (0..workers)
        .map(|w| {
            Partition::new(
                &LocalStore::new(),
                StateConfig {
                    partition: w,
                    ..StateConfig::default()
                },
            )
            .expect("partition")
        })
        .collect();
    let mut dets: Vec<Trojan> = parts
        .iter_mut()
        .map(|p| Trojan::declare(&Config::default(), &mut p.declare("trojan")).expect("declare"))
        .collect();
    let mut now = 1_700_000_000 * SEC;
    for (clock, mut f) in frames {
        let d = dissect(&f).expect("generated frames dissect");
        let flow = d.flow.expect("flow");
        let direction = match flow.src {
            IpAddr::V4(a) if a.octets()[0] == 10 => Direction::Outbound,
            _ => Direction::Inbound,
        };
        let w = factory
            .partition(&flow, None, direction, workers)
            .expect("partitioned by host") as usize;
        now += 100_000;
        let cx = Context {
            now,
            clock,
            partition: w as u32,
        };
        let mut pkt = Packet {
            data: &mut f,
            dissection: d,
            direction,
        };
        assert_eq!(dets[w].process(&mut pkt, &cx), Verdict::Forward);
    }
    let mut hosts: Vec<IpAddr> = dets.iter().flat_map(Trojan::alerted_hosts).collect();
    hosts.sort();
    for d in &dets {
        for h in d.alerted_hosts() {
            assert_eq!(d.host(&h).map(|s| s.alerts()), Some(1), "{h} alerted once");
        }
    }
    hosts
}

/// CHC Fig. 2: the FTP traffic goes through a slow scrubber and reaches the detector after the
/// IRC traffic it preceded. With the logical clocks stamped at the chain's input every
/// infected host is still found; by arrival order alone none is (CHC §7, R4).
#[test]
fn profile_slow_ftp_path_needs_the_clocks() {
    let (frames, truth) = trace(60, 5);
    let n = frames.len() as u64;
    let mut delivered: Vec<(u64, u64, Vec<u8>)> = frames
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let flow = dissect(&f).ok().and_then(|d| d.flow).expect("flow");
            // The profile's FTP server (control and data connections).
            let server = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 21));
            let ftp = flow.src == server || flow.dst == server;
            let at = if ftp { i as u64 + n } else { i as u64 };
            (at, i as u64 + 1, f)
        })
        .collect();
    delivered.sort_by_key(|(at, clock, _)| (*at, *clock));
    let with_clocks = detect_concrete(
        delivered.iter().map(|(_, c, f)| (*c, f.clone())).collect(),
        2,
    );
    assert_eq!(with_clocks, truth);
    let arrival_only = detect_concrete(delivered.into_iter().map(|(_, _, f)| (0, f)).collect(), 2);
    assert!(arrival_only.is_empty(), "{arrival_only:?}");
}

impl Det {
    fn report(&self, name: &str) -> i64 {
        self.nf
            .report()
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{name} reported"))
    }
}

/// `max_flows` bounds the reassembly's streams and the partial lines: at the cap a new stream
/// ends the oldest one never answered (early drop), and a new line the oldest line of such a
/// stream, else they are refused; an answered connection keeps its stream and its half
/// command.
#[test]
fn streams_and_lines_hold_at_most_max_flows() {
    const CAP: i64 = 3;
    const FLOOD: u16 = 5;
    let excess = i64::from(FLOOD) - (CAP - 1);
    for early_drop in [true, false] {
        let mut d = Det::new(&format!("max_flows = {CAP}\nearly_drop = {early_drop}"));
        assert_eq!(d.report("max_streams"), CAP);
        assert_eq!(d.report("max_lines"), CAP);
        // An answered FTP control connection with half a command.
        let a = me(40001);
        for f in [
            frame(a, FTP, 100, SYN, b""),
            frame(FTP, a, 500, SYN | ACK, b""),
            frame(a, FTP, 101, ACK, b""),
            frame(a, FTP, 101, PSH | ACK, b"RETR x."),
        ] {
            assert_eq!(d.feed(f, 0), Verdict::Forward);
        }
        // Streams picked up midstream, never answered, each with half a line.
        for i in 0..FLOOD {
            let f = frame(me(41000 + i), WEB, 100, PSH | ACK, b"NICK ab");
            assert_eq!(d.feed(f, 0), Verdict::Forward);
            assert!(d.report("tcp_connections") <= CAP);
            assert!(d.report("lines") <= CAP);
        }
        assert_eq!(d.report("tcp_connections"), CAP);
        assert_eq!(d.report("lines"), CAP);
        if early_drop {
            assert_eq!(d.report("streams_early_dropped"), excess);
            assert_eq!(d.report("lines_early_dropped"), excess);
            assert_eq!(d.report("streams_table_full"), 0);
        } else {
            assert_eq!(d.report("streams_early_dropped"), 0);
            assert_eq!(d.report("lines_early_dropped"), 0);
            assert_eq!(d.report("streams_table_full"), excess);
        }
        // The answered connection's command completes: its stream and line were kept.
        assert_eq!(
            d.feed(frame(a, FTP, 108, PSH | ACK, b"zip\r\n"), 0),
            Verdict::Forward
        );
        assert_eq!(d.report("ftp_events"), 1, "early_drop = {early_drop}");
    }
}

#[test]
fn cap_keys_are_checked() {
    for (toml, key) in [
        ("max_flows = 0", "max_flows"),
        ("max_flows = \"lots\"", "max_flows"),
        ("early_drop = 0", "early_drop"),
    ] {
        let table: toml::Table = toml.parse().unwrap();
        match Config::from_table(&table) {
            Err(BuildError::Config { key: k, .. }) => assert_eq!(k, key, "{toml}"),
            Err(e) => panic!("{toml}: {e}"),
            Ok(_) => panic!("{toml}: accepted"),
        }
    }
}
