//! TCP window tracking against Linux's conntrack, in the lab (needs root and
//! scripts/setup-live; skipped with a message when not root).
//!
//! The same crafted segments go from raw sockets in the client and server namespaces through
//! (a) Linux as the box, forwarding with nftables `ct state invalid drop`, and (b) flowstate's
//! firewall with `liberal = false`; an AF_PACKET socket on the far side records what arrived.
//! Each probe is followed by a UDP marker on the same path: once the marker is seen, the probe
//! has arrived or was dropped (the path keeps order: one worker, no XDP fast path, which would
//! let established flows overtake the chain), so no verdict waits on a clock. The hosts' own
//! stacks are kept quiet by nftables input rules (they would answer the crafted segments
//! with RSTs). Then a window-scaled curl download goes through flowstate's firewall.

use flowstate_lab::{Lab, System, CLIENT, CLIENT_IF, HTTP_PORT, SERVER, SERVER_IF};
use flowstate_testkit::is_root;
use flowstate_wire::build::{
    tcp_flags::{ACK, PSH, RST, SYN},
    FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, TcpOptions, TcpSpec, UdpSpec,
    ETHERNET_HEADER_LEN,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

/// `send`: IPv4 packets in hex on stdin, each sent on a raw socket (IP_HDRINCL); `sniff
/// IFACE`: the IP identification of each TCP segment to or from ports 7000–7999 and each UDP
/// datagram to port 9000 arriving on IFACE, one a line.
const HELPER: &str = r#"
import socket, struct, sys
if sys.argv[1] == "send":
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    for line in sys.stdin:
        b = bytes.fromhex(line.strip())
        s.sendto(b, (socket.inet_ntoa(b[16:20]), 0))
        print("sent", flush=True)
else:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    s.bind((sys.argv[2], 0))
    print("ready", flush=True)
    while True:
        f, addr = s.recvfrom(65535)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        ip = f[14:]
        if len(ip) < 24:
            continue
        l4 = ip[(ip[0] & 15) * 4:]
        sport, dport = struct.unpack("!HH", l4[:4])
        if (ip[9] == 6 and (7000 <= sport < 8000 or 7000 <= dport < 8000)) or (ip[9] == 17 and dport == 9000):
            print(struct.unpack("!H", ip[4:6])[0], flush=True)
"#;

/// Client and server ISNs of every case.
const CI: u32 = 1_000_000;
const SI: u32 = 5_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    Client,
    Server,
}

/// One crafted segment and whether conntrack lets it through.
#[derive(Debug, Clone, Copy)]
struct Step {
    from: From,
    flags: u8,
    seq: u32,
    ack: u32,
    len: usize,
    pass: bool,
    /// The window, if not Linux's usual (502 from the client, 509 from the server, scaled by
    /// 128; 64240 and 65160 in SYNs).
    win: Option<u16>,
}

fn c(flags: u8, seq: u32, ack: u32, len: usize, pass: bool) -> Step {
    Step {
        from: From::Client,
        flags,
        seq,
        ack,
        len,
        pass,
        win: None,
    }
}

fn s(flags: u8, seq: u32, ack: u32, len: usize, pass: bool) -> Step {
    Step {
        from: From::Server,
        ..c(flags, seq, ack, len, pass)
    }
}

/// The handshake (windows and scale 7 as Linux sends them), 100 bytes from the client and the
/// server's ACK of them.
fn opened() -> Vec<Step> {
    vec![
        c(SYN, CI, 0, 0, true),
        s(SYN | ACK, SI, CI + 1, 0, true),
        c(ACK, CI + 1, SI + 1, 0, true),
        c(ACK | PSH, CI + 1, SI + 1, 100, true),
        s(ACK, SI + 1, CI + 101, 0, true),
    ]
}

/// The cases: name and segments.
fn cases() -> Vec<(&'static str, Vec<Step>)> {
    let far = 1_000_000;
    let then = |more: Vec<Step>| [opened(), more].concat();
    vec![
        (
            "out_of_window_data",
            then(vec![
                s(ACK | PSH, SI + 1 + far, CI + 101, 100, false),
                c(ACK, CI + 101, SI + 1 + 5000, 0, false),
                s(ACK | PSH, SI + 1, CI + 101, 100, true),
                c(ACK, CI + 101, SI + 101, 0, true),
            ]),
        ),
        (
            "rst_outside_the_window",
            then(vec![
                c(RST, CI + 50, 0, 0, false),
                c(RST, CI + 101 + far, 0, 0, false),
                c(ACK | PSH, CI + 101, SI + 1, 10, true),
                s(ACK, SI + 1, CI + 111, 0, true),
            ]),
        ),
        (
            "rst_in_the_window",
            then(vec![
                c(RST, CI + 101 + 1000, 0, 0, true),
                s(ACK | PSH, SI + 1, CI + 101, 10, true),
                c(RST, CI + 101, 0, 0, true),
            ]),
        ),
        (
            // An ACK answering the SYN from an older connection the server still holds
            // (RFC 5961 §4), the RST it asks for, and a new SYN.
            "challenge_ack_to_a_syn",
            vec![
                c(SYN, CI, 0, 0, true),
                s(ACK, SI + 777, CI + 123_456, 0, true),
                c(RST, CI + 123_456, 0, 0, true),
                c(SYN, CI + 200_000, 0, 0, true),
                s(SYN | ACK, SI, CI + 200_001, 0, true),
                c(ACK, CI + 200_001, SI + 1, 0, true),
            ],
        ),
        (
            "syn_in_established",
            then(vec![
                c(SYN, CI + 500_000, 0, 0, true),
                s(SYN, SI + 700_000, 0, 0, false),
                s(SYN | ACK, SI + 700_000, CI + 500_001, 0, true),
                c(ACK, CI + 500_001, SI + 700_001, 0, true),
                c(ACK | PSH, CI + 500_001, SI + 700_001, 10, true),
            ]),
        ),
        (
            // 50 segments of 1400 bytes, each acknowledged: the first one, sent again, ends
            // more than the client's window (64256) below the server's end: conntrack ignores
            // it (passes, nothing updated), as it ignores an ack that old.
            "old_retransmission",
            then(
                (0..50u32)
                    .flat_map(|i| {
                        let seq = SI + 1 + i * 1400;
                        [
                            s(ACK, seq, CI + 101, 1400, true),
                            c(ACK, CI + 101, seq + 1400, 0, true),
                        ]
                    })
                    .chain([
                        s(ACK | PSH, SI + 1, CI + 101, 1400, true),
                        c(ACK, CI + 101, SI + 1, 0, true),
                        s(ACK | PSH, SI + 1 + 70_000 + far, CI + 101, 100, false),
                    ])
                    .collect(),
            ),
        ),
        (
            "zero_window",
            then(vec![
                Step {
                    win: Some(0),
                    ..c(ACK, CI + 101, SI + 1, 0, true)
                },
                s(ACK, SI + 1, CI + 101, 1, true),
                s(ACK | PSH, SI + 1 + 200_000, CI + 101, 100, false),
                c(ACK, CI + 101, SI + 2, 0, true),
            ]),
        ),
        (
            "rst_answering_a_syn",
            vec![
                c(SYN, CI, 0, 0, true),
                s(RST | ACK, 0, CI + 1, 0, true),
                c(SYN, CI + 10_000, 0, 0, true),
                s(SYN | ACK, SI, CI + 10_001, 0, true),
                c(ACK, CI + 10_001, SI + 1, 0, true),
            ],
        ),
        (
            "simultaneous_open",
            vec![
                c(SYN, CI, 0, 0, true),
                s(SYN, SI, 0, 0, true),
                c(SYN | ACK, CI, SI + 1, 0, true),
                s(SYN | ACK, SI, CI + 1, 0, true),
                s(ACK, SI + 1, CI + 1, 0, true),
                c(ACK | PSH, CI + 1, SI + 1, 10, true),
                s(ACK | PSH, SI + 1, CI + 11, 10, true),
            ],
        ),
    ]
}

/// The IPv4 packet of a TCP segment (or, `udp`, of a marker) between `client_port` and
/// `server_port`.
fn packet(step: &Step, id: u16, client_port: u16, server_port: u16, udp: bool) -> Vec<u8> {
    let (src, dst, sp, dp) = match step.from {
        From::Client => (CLIENT, SERVER, client_port, server_port),
        From::Server => (SERVER, CLIENT, server_port, client_port),
    };
    let ip = Ipv4Spec {
        id,
        ..Ipv4Spec::new(src, dst)
    };
    let l4 = if udp {
        L4Spec::Udp(UdpSpec {
            src_port: 9000,
            dst_port: 9000,
        })
    } else {
        L4Spec::Tcp(TcpSpec {
            src_port: sp,
            dst_port: dp,
            seq: step.seq,
            ack: step.ack,
            flags: step.flags,
            window: step
                .win
                .unwrap_or(if step.from == From::Client { 502 } else { 509 }),
            urgent: 0,
            options: if step.flags & SYN != 0 {
                TcpOptions {
                    mss: Some(1460),
                    window_scale: Some(7),
                    sack_permitted: true,
                    timestamps: None,
                }
            } else {
                TcpOptions::NONE
            },
        })
    };
    // SYNs carry Linux's initial windows.
    let l4 = match l4 {
        L4Spec::Tcp(mut t) if step.flags & SYN != 0 => {
            t.window = if step.from == From::Client {
                64240
            } else {
                65160
            };
            L4Spec::Tcp(t)
        }
        other => other,
    };
    let frame = flowstate_testkit::write(&FrameSpec {
        ethernet: flowstate_testkit::ethernet(),
        ip: IpSpec::V4(ip),
        l4,
        payload: Payload::Fill {
            len: if udp { 4 } else { step.len },
            byte: b'x',
        },
        min_len: 0,
    });
    frame[ETHERNET_HEADER_LEN..].to_vec()
}

/// A host's raw sender and sniffer.
struct Host {
    send_in: ChildStdin,
    send_out: BufReader<ChildStdout>,
    seen: Receiver<u16>,
}

impl Host {
    fn start(ns: &str, iface: &str, helper: &str, children: &mut Vec<Child>) -> Host {
        let spawn = |args: &[&str]| {
            Command::new("ip")
                .args(["netns", "exec", ns, "python3", "-u", helper])
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("python3 (scripts/setup-live)")
        };
        let mut sender = spawn(&["send"]);
        let mut sniffer = spawn(&["sniff", iface]);
        let send_in = sender.stdin.take().unwrap();
        let send_out = BufReader::new(sender.stdout.take().unwrap());
        let mut lines = BufReader::new(sniffer.stdout.take().unwrap()).lines();
        assert_eq!(
            lines.next().and_then(Result::ok).as_deref(),
            Some("ready"),
            "the sniffer in {ns} started"
        );
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if let Ok(id) = l.trim().parse::<u16>() {
                    if tx.send(id).is_err() {
                        break;
                    }
                }
            }
        });
        children.push(sender);
        children.push(sniffer);
        Host {
            send_in,
            send_out,
            seen,
        }
    }

    fn send(&mut self, packet: &[u8]) {
        let hex: String = packet.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(self.send_in, "{hex}").unwrap();
        let mut ack = String::new();
        self.send_out.read_line(&mut ack).unwrap();
        assert_eq!(ack.trim(), "sent");
    }
}

/// The lab and everything started in it, stopped and removed on drop.
struct Rig {
    lab: Lab,
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.lab.down(&mut System::default());
    }
}

fn run(argv: &[&str]) {
    let o = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn nft(ns: &str, args: &[&str]) {
    run(&[&["ip", "netns", "exec", ns, "nft"][..], args].concat());
}

/// Runs every case through whatever box is up; per case, whether each step arrived. `run` picks
/// the ports, so that runs do not share connections.
fn run_cases(client: &mut Host, server: &mut Host, run: u16, next_id: &mut u16) -> Vec<Vec<bool>> {
    let marker = |from: From| Step {
        from,
        ..c(0, 0, 0, 0, true)
    };
    let mut id = || {
        *next_id = next_id.wrapping_add(1);
        *next_id
    };
    // The client's first marker opens the markers' UDP flow, which the server's then answer.
    let mut results = Vec::new();
    for (k, (_, steps)) in cases().iter().enumerate() {
        let (cp, sp) = (40_000 + run * 100 + k as u16, 7000 + run * 100 + k as u16);
        let mut arrived = Vec::new();
        for (i, step) in [marker(From::Client)].iter().chain(steps).enumerate() {
            let (probe_id, marker_id) = (id(), id());
            let is_marker = i == 0;
            let (from, to) = match step.from {
                From::Client => (&mut *client, &mut *server),
                From::Server => (&mut *server, &mut *client),
            };
            if !is_marker {
                from.send(&packet(step, probe_id, cp, sp, false));
            }
            from.send(&packet(&marker(step.from), marker_id, cp, sp, true));
            let mut got = false;
            loop {
                match to.seen.recv_timeout(Duration::from_secs(10)) {
                    Ok(x) if x == probe_id => got = true,
                    Ok(x) if x == marker_id => break,
                    Ok(_) => {}
                    Err(e) => panic!("marker {marker_id} of step {i} never arrived: {e}"),
                }
            }
            if !is_marker {
                arrived.push(got);
            }
        }
        results.push(arrived);
    }
    results
}

fn report(summary: &serde_json::Value, key: &str) -> i64 {
    summary["nfs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "firewall")
        .unwrap_or_else(|| panic!("firewall in {summary}"))["report"][key]
        .as_i64()
        .unwrap_or(0)
}

#[test]
fn window_tracking_agrees_with_linux_conntrack() {
    if !is_root() {
        eprintln!("skipped: the lab needs root");
        return;
    }
    let prefix = format!("fs-w{}-", std::process::id() % 100_000);
    let mut rig = Rig {
        lab: Lab::new(&prefix).unwrap(),
        children: Vec::new(),
        dir: tempfile::tempdir().unwrap(),
    };
    rig.lab.up(&mut System::default()).unwrap();
    let (cns, nns, sns) = (rig.lab.client_ns(), rig.lab.nf_ns(), rig.lab.server_ns());
    // The hosts' stacks must not answer the crafted segments (AF_PACKET sees them first).
    for (ns, rule) in [
        (&cns, "tcp sport 7000-7999 drop"),
        (&sns, "tcp dport 7000-7999 drop"),
    ] {
        nft(ns, &["add", "table", "inet", "fswin"]);
        nft(
            ns,
            &[
                "add",
                "chain",
                "inet",
                "fswin",
                "fw_input",
                "{ type filter hook input priority 0; policy accept; }",
            ],
        );
        let mut r = vec!["add", "rule", "inet", "fswin", "fw_input"];
        r.extend(rule.split(' '));
        nft(ns, &r);
        nft(
            ns,
            &[
                "add", "rule", "inet", "fswin", "fw_input", "udp", "dport", "9000", "drop",
            ],
        );
    }
    let helper = rig.dir.path().join("raw.py");
    std::fs::write(&helper, HELPER).unwrap();
    let helper = helper.to_str().unwrap().to_owned();
    let mut client = Host::start(&cns, CLIENT_IF, &helper, &mut rig.children);
    let mut server = Host::start(&sns, SERVER_IF, &helper, &mut rig.children);
    let mut ids = 0x1000u16;

    // (a) Linux: a router with conntrack, invalid packets dropped.
    rig.lab.kernel_router(&mut System::default(), true).unwrap();
    nft(&nns, &["add", "table", "inet", "fswin"]);
    nft(
        &nns,
        &[
            "add",
            "chain",
            "inet",
            "fswin",
            "fw_forward",
            "{ type filter hook forward priority 0; policy accept; }",
        ],
    );
    nft(
        &nns,
        &[
            "add",
            "rule",
            "inet",
            "fswin",
            "fw_forward",
            "ct",
            "state",
            "invalid",
            "drop",
        ],
    );
    run(&[
        "ip",
        "netns",
        "exec",
        &nns,
        "sysctl",
        "-qw",
        "net.netfilter.nf_conntrack_tcp_be_liberal=0",
    ]);
    let linux = run_cases(&mut client, &mut server, 0, &mut ids);
    nft(&nns, &["delete", "table", "inet", "fswin"]);
    rig.lab
        .kernel_router(&mut System::default(), false)
        .unwrap();

    // (b) flowstate's firewall, windows enforced.
    let config = rig.dir.path().join("box.toml");
    std::fs::write(
        &config,
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"fs-out\"\naddress = \"198.51.100.1\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n[state]\nbackend = \"local\"\n\
         [[chain]]\nnf = \"firewall\"\nliberal = false\n",
    )
    .unwrap();
    let mut flowstate = Command::new("ip")
        .args(["netns", "exec", &nns])
        .arg(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", "--json"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ping = || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &cns,
                "ping",
                "-c1",
                "-W1",
                &SERVER.to_string(),
            ])
            .output()
            .unwrap()
            .status
            .success()
    };
    let mut up = false;
    for _ in 0..40 {
        if ping() {
            up = true;
            break;
        }
        if let Ok(Some(status)) = flowstate.try_wait() {
            panic!("flowstate exited early ({status})");
        }
    }
    if !up {
        let _ = flowstate.kill();
        panic!("the client never reached the server through flowstate");
    }
    let ours = run_cases(&mut client, &mut server, 1, &mut ids);

    // A window-scaled download (Linux's stacks scale by 7) through the enforcing firewall.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(rig.lab.www('a').join("w.bin"), &data).unwrap();
    let to = rig.dir.path().join("w.bin");
    let curl = Command::new("ip")
        .args(["netns", "exec", &cns, "curl", "-sSf", "-m", "60", "-o"])
        .arg(&to)
        .arg(format!("http://{SERVER}:{HTTP_PORT}/w.bin"))
        .output()
        .unwrap();
    let downloaded = std::fs::read(&to).unwrap_or_default();

    run(&["kill", "-TERM", &flowstate.id().to_string()]);
    let out = flowstate.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "flowstate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let mut table = String::new();
    let mut disagree = Vec::new();
    for (k, (name, steps)) in cases().iter().enumerate() {
        for (i, step) in steps.iter().enumerate() {
            let (l, o) = (linux[k][i], ours[k][i]);
            table.push_str(&format!(
                "{name} #{i} {:?} flags {:#04x} seq {} ack {}: linux {} flowstate {} (conntrack as documented: {})\n",
                step.from,
                step.flags,
                step.seq,
                step.ack,
                l,
                o,
                step.pass
            ));
            if l != o || l != step.pass {
                disagree.push(format!("{name} #{i}"));
            }
        }
    }
    eprintln!("{table}");
    assert!(disagree.is_empty(), "disagreements: {disagree:?}\n{table}");
    assert!(
        curl.status.success() && downloaded == data,
        "the window-scaled download broke: {} ({} bytes)",
        String::from_utf8_lossy(&curl.stderr),
        downloaded.len()
    );
    // Every window drop was one of the probes: the download lost none.
    let probes_dropped = ours.iter().flatten().filter(|p| !**p).count() as i64;
    let window_drops: i64 = [
        "denied_tcp_seq_above_window",
        "denied_tcp_ack_above_data_seen",
        "denied_tcp_rst_out_of_window",
        "denied_tcp_invalid_state",
    ]
    .iter()
    .map(|k| report(&summary, k))
    .sum();
    assert_eq!(window_drops, probes_dropped, "{summary:#}");
    assert!(report(&summary, "allowed_tracked") > 1000, "{summary:#}");
}
