//! Test support for flowstate's crates: the frames their tests send, built one way, and the
//! gates of the tests that check our work against an outside tool (tshark, Suricata).
//!
//! Promises:
//! * A dev-dependency only: no product code depends on it. It depends on `flowstate-wire`
//!   alone, so the tests of every crate, wire's excepted, may use it.
//! * Frames go from [`SRC_MAC`] to [`DST_MAC`]. [`frame`] and the builders on it write
//!   through [`flowstate_wire::build`] (every checksum correct: RFC 791, RFC 768, RFC 9293
//!   §3.1, RFC 792, RFC 4443 §2.3) and pad to [`ETHERNET_MIN_LEN`], as a NIC delivers a short
//!   frame. [`icmp4`] and [`icmp6`] wrap a caller's ICMP message (an error quoting a packet,
//!   any type `build` has no spec for) with correct checksums and no padding.
//! * A builder panics, naming the mistake, on what no test can mean (addresses of two
//!   families, a packet too long for its length fields): these are a test's own errors.
//! * [`tshark_or_skip`], [`suricata_or_skip`] and [`is_root`] say whether a test can run, and
//!   [`run_suricata`] runs Suricata the one way the tests compare with it. A missing tool
//!   skips the test with a `SKIPPED` line; tshark is required where `CI` is set (a missing
//!   tshark there fails the test), Suricata nowhere.

use flowstate_wire::build::{
    EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, Ipv6Spec, L4Spec, Payload, TcpOptions, TcpSpec,
    UdpSpec, ETHERNET_HEADER_LEN, ETHERNET_MIN_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
    IPV4_HEADER_LEN,
};
use flowstate_wire::checksum;
use flowstate_wire::flow::proto;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;

/// The source MAC of every frame built here.
pub const SRC_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

/// The destination MAC of every frame built here.
pub const DST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// The Ethernet header of every frame built here: [`SRC_MAC`] to [`DST_MAC`], untagged.
pub const fn ethernet() -> EthernetSpec {
    EthernetSpec::new(SRC_MAC, DST_MAC)
}

/// The bytes of `spec`, exactly [`FrameSpec::frame_len`] of them.
///
/// # Panics
/// When the IP packet is too long for its length fields.
pub fn write(spec: &FrameSpec<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; spec.frame_len()];
    match spec.write(&mut buf) {
        Ok(n) => {
            buf.truncate(n);
            buf
        }
        Err(e) => panic!("the test's frame does not build: {e}"),
    }
}

/// A frame [`SRC_MAC`] to [`DST_MAC`] of `ip`, `l4` and `payload`, padded to
/// [`ETHERNET_MIN_LEN`].
pub fn frame_with(ip: IpSpec, l4: L4Spec, payload: Payload<'_>) -> Vec<u8> {
    write(&FrameSpec {
        ethernet: ethernet(),
        ip,
        l4,
        payload,
        min_len: ETHERNET_MIN_LEN,
    })
}

/// [`frame_with`] these payload bytes.
pub fn frame(ip: IpSpec, l4: L4Spec, payload: &[u8]) -> Vec<u8> {
    frame_with(ip, l4, Payload::Bytes(payload))
}

/// The IP header from `src` to `dst`, with [`Ipv4Spec::new`]'s or [`Ipv6Spec::new`]'s
/// defaults.
///
/// # Panics
/// When `src` and `dst` are of different families.
pub fn ip(src: IpAddr, dst: IpAddr) -> IpSpec {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpSpec::V4(Ipv4Spec::new(s, d)),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpSpec::V6(Ipv6Spec::new(s, d)),
        _ => panic!("mixed address families: {src} to {dst}"),
    }
}

/// A TCP header with these ports, numbers and flags ([`flowstate_wire::build::tcp_flags`]),
/// a 65535-byte window, no urgent pointer and no options.
pub const fn tcp_spec(src_port: u16, dst_port: u16, seq: u32, ack: u32, flags: u8) -> TcpSpec {
    TcpSpec {
        src_port,
        dst_port,
        seq,
        ack,
        flags,
        window: 65535,
        urgent: 0,
        options: TcpOptions::NONE,
    }
}

/// An IPv4 TCP segment from `src` to `dst` (address, port) of [`tcp_spec`] carrying `data`.
pub fn tcp4(
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    seq: u32,
    ack: u32,
    flags: u8,
    data: &[u8],
) -> Vec<u8> {
    frame(
        IpSpec::V4(Ipv4Spec::new(src.0, dst.0)),
        L4Spec::Tcp(tcp_spec(src.1, dst.1, seq, ack, flags)),
        data,
    )
}

/// An IPv4 UDP datagram from `src` to `dst` (address, port) carrying `data`.
pub fn udp4(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), data: &[u8]) -> Vec<u8> {
    frame(
        IpSpec::V4(Ipv4Spec::new(src.0, dst.0)),
        L4Spec::Udp(UdpSpec {
            src_port: src.1,
            dst_port: dst.1,
        }),
        data,
    )
}

/// The ICMP message `message` (type, code, checksum, rest of header, body; RFC 792) from
/// `src` to `dst` in an IPv4 packet (identification 0, TTL 64, no options, Don't Fragment as
/// given), its checksum written over whatever `message` has there. Not padded.
///
/// # Panics
/// When `message` is shorter than an ICMP header (8 bytes) or too long for IPv4.
pub fn icmp4(src: Ipv4Addr, dst: Ipv4Addr, dont_fragment: bool, message: &[u8]) -> Vec<u8> {
    let msg = with_checksum(message, checksum::checksum);
    let total = u16::try_from(IPV4_HEADER_LEN + msg.len())
        .unwrap_or_else(|_| panic!("an ICMP message of {} bytes is too long", msg.len()));
    let mut f = ethernet_header(ETHERTYPE_IPV4);
    let flags: u8 = if dont_fragment { 0x40 } else { 0 };
    let mut h = vec![0x45, 0, 0, 0, 0, 0, flags, 0, 64, proto::ICMP, 0, 0];
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = checksum::checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(&msg);
    f
}

/// The ICMPv6 message `message` (type, code, checksum, body; RFC 4443 §2.1) from `src` to
/// `dst` in an IPv6 packet with `hop_limit` (traffic class and flow label 0, no extension
/// headers), its checksum (over the pseudo-header, RFC 4443 §2.3) written over whatever
/// `message` has there. Not padded.
///
/// # Panics
/// When `message` is shorter than 4 bytes or longer than an IPv6 payload length can say.
pub fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, message: &[u8]) -> Vec<u8> {
    let len = u16::try_from(message.len())
        .unwrap_or_else(|_| panic!("an ICMPv6 message of {} bytes is too long", message.len()));
    let msg = with_checksum(message, |m| {
        checksum::finish(checksum::combine(
            checksum::pseudo_header_v6(&src.octets(), &dst.octets(), proto::ICMPV6, u32::from(len)),
            checksum::sum(m),
        ))
    });
    let mut f = ethernet_header(ETHERTYPE_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(&[proto::ICMPV6, hop_limit]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&msg);
    f
}

/// `message` with its checksum field (bytes 2 and 3) zeroed, then set to `sum` of it.
fn with_checksum(message: &[u8], sum: impl FnOnce(&[u8]) -> u16) -> Vec<u8> {
    assert!(
        message.len() >= 4,
        "an ICMP message of {} bytes has no checksum field",
        message.len()
    );
    let mut msg = message.to_vec();
    msg[2..4].fill(0);
    let c = sum(&msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    msg
}

/// An untagged Ethernet II header [`SRC_MAC`] to [`DST_MAC`] of `ethertype`.
fn ethernet_header(ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETHERNET_HEADER_LEN);
    f.extend_from_slice(&DST_MAC);
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// Whether the tests run as root (effective user 0, from `/proc/self/status`): what the lab's
/// namespaces, AF_PACKET sockets and loading XDP programs need. A test that needs root skips
/// itself, saying why, when this is `false`.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether `program arg` runs and exits successfully.
fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether test `test` can run its tshark oracle: tshark runs here. Missing, it is a failure
/// where `CI` is set (a panic) and a skip elsewhere (`false`, with a `SKIPPED` line).
pub fn tshark_or_skip(test: &str) -> bool {
    if runs("tshark", "--version") {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: tshark is required in CI (scripts/setup installs it)"
    );
    eprintln!("SKIPPED {test}: tshark not found (scripts/setup installs it)");
    false
}

/// Whether test `test` can compare with Suricata: `suricata` runs here. Missing, the test is
/// skipped (`false`, with a `SKIPPED` line), in CI too.
pub fn suricata_or_skip(test: &str) -> bool {
    if runs("suricata", "-V") {
        return true;
    }
    eprintln!("SKIPPED {test}: no suricata (scripts/setup-live installs it)");
    false
}

/// The configuration Suricata's package installs, which the tests run it with.
pub const SURICATA_YAML: &str = "/etc/suricata/suricata.yaml";

/// Runs Suricata over the capture `pcap` with the rules of the file `rules` alone, as the
/// tests compare with it: [`SURICATA_YAML`], one thread (`--runmode single`), checksums not
/// validated (`-k none`), and `options`. Its logs (`eve.json`) go to `log_dir`.
///
/// # Panics
/// When suricata cannot be started or fails; the message holds its standard error.
pub fn run_suricata(pcap: &Path, rules: &Path, log_dir: &Path, options: &[&str]) {
    let out = Command::new("suricata")
        .args(["-c", SURICATA_YAML, "--runmode", "single", "-k", "none"])
        .args(options)
        .arg("-r")
        .arg(pcap)
        .arg("-S")
        .arg(rules)
        .arg("-l")
        .arg(log_dir)
        .output()
        .unwrap_or_else(|e| panic!("suricata does not start: {e}"));
    assert!(
        out.status.success(),
        "suricata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_wire::build::tcp_flags::{ACK, SYN};
    use flowstate_wire::dissect::{dissect, verify_checksums, Transport};

    fn checksums_ok(f: &[u8]) -> bool {
        let d = dissect(f).expect("dissects");
        let st = verify_checksums(f, &d);
        st.ip != Some(false) && st.transport == Some(true)
    }

    #[test]
    fn tcp_and_udp_frames_are_padded_and_correct() {
        let a = (Ipv4Addr::new(10, 0, 0, 1), 40_000);
        let b = (Ipv4Addr::new(198, 51, 100, 2), 80);
        let syn = tcp4(a, b, 7, 0, SYN, b"");
        assert_eq!(syn.len(), ETHERNET_MIN_LEN);
        assert_eq!(&syn[0..6], &DST_MAC);
        assert_eq!(&syn[6..12], &SRC_MAC);
        assert!(checksums_ok(&syn));
        let data = tcp4(a, b, 8, 9, ACK, &[1; 100]);
        assert_eq!(data.len(), 14 + 20 + 20 + 100);
        assert!(checksums_ok(&data));
        let u = udp4(a, b, b"query");
        assert_eq!(u.len(), ETHERNET_MIN_LEN);
        assert!(checksums_ok(&u));
        let v6 = frame(
            ip("fd00::1".parse().unwrap(), "2001:db8::2".parse().unwrap()),
            L4Spec::Udp(UdpSpec {
                src_port: 1,
                dst_port: 2,
            }),
            b"v6",
        );
        assert!(checksums_ok(&v6));
    }

    #[test]
    fn icmp_messages_get_their_checksums() {
        let quoted = udp4(
            (Ipv4Addr::new(10, 0, 0, 1), 1),
            (Ipv4Addr::new(10, 0, 0, 2), 2),
            b"x",
        );
        let mut msg = vec![3, 3, 0xde, 0xad, 0, 0, 0, 0];
        msg.extend_from_slice(&quoted[14..14 + 28]);
        let f = icmp4(
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 0, 1),
            true,
            &msg,
        );
        assert_eq!(f.len(), 14 + 20 + msg.len());
        assert_eq!(f[20], 0x40, "Don't Fragment");
        let d = dissect(&f).unwrap();
        assert!(matches!(
            d.transport,
            Transport::Icmpv4 { kind: 3, code: 3 }
        ));
        assert_eq!(checksum::checksum(&f[14..34]), 0, "IPv4 header checksum");
        assert_eq!(checksum::checksum(&f[34..]), 0, "ICMP checksum");

        let (s, t): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let f = icmp6(s, t, 255, &[135, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f.len(), 14 + 40 + 8);
        let d = dissect(&f).unwrap();
        assert_eq!(verify_checksums(&f, &d).transport, Some(true));
    }

    #[test]
    #[should_panic(expected = "mixed address families")]
    fn mixed_families_are_a_test_error() {
        ip("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
    }
}
