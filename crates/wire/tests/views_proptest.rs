//! Property tests: parsers never panic on any bytes, and incremental checksum updates (RFC 1624)
//! equal a full recomputation.

mod views_check;
mod views_data;

use flowstate_wire::dissect::{dissect, verify_checksums};
use flowstate_wire::icmp;
use flowstate_wire::tcp::{self, PseudoHeader};
use flowstate_wire::{checksum, ipv4, udp};
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};
use views_check::{check_dissection, exercise_options, exercise_views};

fn fixtures() -> Vec<Vec<u8>> {
    views_data::ALL
        .iter()
        .map(|(_, h)| views_data::hex(h))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..160)) {
        if let Ok(d) = dissect(&b) {
            check_dissection(&b, &d);
        }
        exercise_views(&b);
        exercise_options(&b);
    }

    /// Random bytes behind a valid Ethernet + IPv4/IPv6 prefix reach the deeper parsers.
    #[test]
    fn random_ip_payloads_never_panic(
        v6 in any::<bool>(),
        first in any::<u8>(),
        proto in prop_oneof![Just(0u8), Just(1), Just(6), Just(17), Just(43), Just(44), Just(58), Just(60), any::<u8>()],
        body in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut f = vec![0u8; 12];
        if v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60 | (first & 0x0f), 0, 0, 0]);
            f.extend_from_slice(&(body.len() as u16).to_be_bytes());
            f.extend_from_slice(&[proto, 64]);
            f.extend_from_slice(&[0; 32]);
        } else {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&(20 + body.len() as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0, first & 0x3f, 0, 64, proto, 0, 0]);
            f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        }
        f.extend_from_slice(&body);
        match dissect(&f) {
            Ok(d) => check_dissection(&f, &d),
            Err(e) => prop_assert!(!e.reason.is_empty()),
        }
    }

    /// Valid frames with random bytes overwritten and random truncation.
    #[test]
    fn mutated_fixtures_never_panic(
        which in 0usize..14,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let all = fixtures();
        let mut f = all[which % all.len()].clone();
        for (at, v) in edits {
            let i = at.index(f.len());
            f[i] = v;
        }
        if truncate {
            f.truncate(cut.index(f.len() + 1));
        }
        if let Ok(d) = dissect(&f) {
            check_dissection(&f, &d);
        }
        exercise_views(&f);
    }

    /// verify_checksums with a dissection of another frame never panics.
    #[test]
    fn verify_with_foreign_dissection(a in 0usize..14, b in 0usize..14, cut in any::<prop::sample::Index>()) {
        let all = fixtures();
        let fa = &all[a % all.len()];
        let fb = &all[b % all.len()];
        let d = dissect(fa).unwrap();
        let short = &fb[..cut.index(fb.len() + 1)];
        let _ = verify_checksums(short, &d);
    }

    #[test]
    fn ipv4_incremental_equals_full(
        hdr in proptest::collection::vec(any::<u8>(), 20..=60),
        src in any::<[u8; 4]>(),
        dst in any::<[u8; 4]>(),
        ttl in any::<u8>(),
    ) {
        let mut b = hdr;
        let ihl = (b.len() / 4) as u8;
        b.truncate(usize::from(ihl) * 4);
        b[0] = 0x40 | ihl;
        let len = b.len() as u16;
        b[2..4].copy_from_slice(&len.to_be_bytes());
        let mut p = ipv4::Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum();
        prop_assert!(p.verify_checksum());
        p.set_src_addr(Ipv4Addr::from(src));
        prop_assert_eq!(p.checksum(), p.compute_checksum());
        p.set_dst_addr(Ipv4Addr::from(dst));
        prop_assert_eq!(p.checksum(), p.compute_checksum());
        p.set_ttl(ttl);
        prop_assert_eq!(p.checksum(), p.compute_checksum());
        prop_assert!(p.verify_checksum());
        prop_assert_eq!((p.src_addr().octets(), p.dst_addr().octets(), p.ttl()), (src, dst, ttl));
    }

    #[test]
    fn tcp_incremental_equals_full(
        seg in proptest::collection::vec(any::<u8>(), 20..100),
        v6 in any::<bool>(),
        old_a in any::<[u8; 16]>(),
        new_a in any::<[u8; 16]>(),
        other in any::<[u8; 16]>(),
        sp in any::<u16>(),
        dp in any::<u16>(),
    ) {
        let mut b = seg;
        b[12] = 0x50;
        let (old_ph, new_ph, old_bytes, new_bytes): (PseudoHeader, PseudoHeader, Vec<u8>, Vec<u8>) = if v6 {
            (
                PseudoHeader::V6 { src: Ipv6Addr::from(old_a), dst: Ipv6Addr::from(other) },
                PseudoHeader::V6 { src: Ipv6Addr::from(new_a), dst: Ipv6Addr::from(other) },
                old_a.to_vec(), new_a.to_vec(),
            )
        } else {
            let (o, n, x) = (
                [old_a[0], old_a[1], old_a[2], old_a[3]],
                [new_a[0], new_a[1], new_a[2], new_a[3]],
                [other[0], other[1], other[2], other[3]],
            );
            (
                PseudoHeader::V4 { src: Ipv4Addr::from(o), dst: Ipv4Addr::from(x) },
                PseudoHeader::V4 { src: Ipv4Addr::from(n), dst: Ipv4Addr::from(x) },
                o.to_vec(), n.to_vec(),
            )
        };
        let mut t = tcp::Packet::new_checked(&mut b[..]).unwrap();
        t.fill_checksum(&old_ph);
        prop_assert!(t.verify_checksum(&old_ph));
        t.set_src_port(sp);
        prop_assert_eq!(t.checksum(), t.compute_checksum(&old_ph));
        t.set_dst_port(dp);
        prop_assert_eq!(t.checksum(), t.compute_checksum(&old_ph));
        t.update_checksum_for_addr(&old_bytes, &new_bytes);
        prop_assert_eq!(t.checksum(), t.compute_checksum(&new_ph));
        prop_assert!(t.verify_checksum(&new_ph));
        prop_assert_eq!((t.src_port(), t.dst_port()), (sp, dp));
    }

    #[test]
    fn udp_incremental_equals_full(
        body in proptest::collection::vec(any::<u8>(), 0..64),
        src in any::<[u8; 4]>(),
        new_src in any::<[u8; 4]>(),
        dst in any::<[u8; 4]>(),
        sp in any::<u16>(),
        dp in any::<u16>(),
        no_checksum in any::<bool>(),
    ) {
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&body);
        let len = b.len() as u16;
        b[4..6].copy_from_slice(&len.to_be_bytes());
        let old_ph = PseudoHeader::V4 { src: Ipv4Addr::from(src), dst: Ipv4Addr::from(dst) };
        let new_ph = PseudoHeader::V4 { src: Ipv4Addr::from(new_src), dst: Ipv4Addr::from(dst) };
        let mut u = udp::Packet::new_checked(&mut b[..]).unwrap();
        if !no_checksum {
            u.fill_checksum(&old_ph);
        }
        u.set_src_port(sp);
        u.set_dst_port(dp);
        u.update_checksum_for_addr(&src, &new_src);
        if no_checksum {
            prop_assert_eq!(u.checksum(), 0);
            prop_assert_eq!(u.verify_checksum(&new_ph), None);
        } else {
            prop_assert_eq!(u.checksum(), u.compute_checksum(&new_ph));
            prop_assert_ne!(u.checksum(), 0);
            prop_assert_eq!(u.verify_checksum(&new_ph), Some(true));
        }
    }

    #[test]
    fn icmp_incremental_equals_full(
        reply in any::<bool>(),
        body in proptest::collection::vec(any::<u8>(), 4..64),
        ident in any::<u16>(),
        seq in any::<u16>(),
        src in any::<[u8; 16]>(),
        dst in any::<[u8; 16]>(),
        new_dst in any::<[u8; 16]>(),
    ) {
        // ICMPv4.
        let mut b = vec![if reply { 0 } else { 8 }, 0, 0, 0];
        b.extend_from_slice(&body);
        let mut m = icmp::v4::Packet::new_checked(&mut b[..]).unwrap();
        m.fill_checksum();
        m.set_echo_ident(ident);
        m.set_echo_seq_no(seq);
        let full = m.compute_checksum();
        // One's-complement arithmetic has two zeros: an all-zero message (echo reply, ident,
        // seq and data 0) has full checksum 0xffff, which an update may write as 0x0000.
        let all_zero = checksum::sum(m.payload()) == 0 && reply && ident == 0 && seq == 0;
        if all_zero {
            prop_assert!(m.checksum() == 0 || m.checksum() == 0xffff);
        } else {
            prop_assert_eq!(m.checksum(), full);
        }
        prop_assert!(m.verify_checksum());
        prop_assert_eq!((m.echo_ident(), m.echo_seq_no()), (ident, seq));

        // ICMPv6: the pseudo-header (with next header 58) is never zero.
        let (s, d, nd) = (Ipv6Addr::from(src), Ipv6Addr::from(dst), Ipv6Addr::from(new_dst));
        let mut b = vec![if reply { 129 } else { 128 }, 0, 0, 0];
        b.extend_from_slice(&body);
        let mut m = icmp::v6::Packet::new_checked(&mut b[..]).unwrap();
        m.fill_checksum(&s, &d);
        m.set_echo_ident(ident);
        prop_assert_eq!(m.checksum(), m.compute_checksum(&s, &d));
        m.update_checksum_for_addr(&d, &nd);
        prop_assert_eq!(m.checksum(), m.compute_checksum(&s, &nd));
        prop_assert!(m.verify_checksum(&s, &nd));
    }
}

/// The random properties above only mean something if the fixtures dissect: a guard.
#[test]
fn fixtures_dissect() {
    for f in fixtures() {
        let d = dissect(&f).unwrap();
        check_dissection(&f, &d);
    }
}
