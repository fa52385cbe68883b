use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

const K1: &str = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const K2: &str = "2 f0e0d0c0b0a090807060504030201000f1e1d1c1b1a191817161514131211100";
/// A clock well past every sequence number the tests start from.
const NOW: u64 = 1_000_000_000_000;
const SKEW: u64 = 60_000_000_000;

fn ring(text: &str) -> KeyRing {
    KeyRing::fixed(Keys::parse(text).unwrap())
}

fn sealed(s: &Sealer, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; payload.len() + TRAILER_LEN];
    buf[..payload.len()].copy_from_slice(payload);
    assert_eq!(s.seal(&mut buf, payload.len()), Some(buf.len()));
    buf
}

#[test]
fn a_sealed_datagram_opens_once_with_its_sender_and_payload() {
    let r = ring(K1);
    let s = r.sealer(Sender::instance(7), NOW - 1000).unwrap();
    let mut o = r.opener(SKEW);
    let d = sealed(&s, b"hello");
    assert_eq!(
        o.open(&mut d.to_vec(), NOW),
        Ok((Sender::instance(7), &b"hello"[..]))
    );
    assert_eq!(o.open(&mut d.to_vec(), NOW), Err(Rejected::Replayed));
    assert_eq!(o.accepted(), 1);
    assert_eq!(o.rejected().get(Rejected::Replayed), 1);
    // No room for the trailer: nothing is written.
    assert_eq!(s.seal(&mut [0u8; 10], 5), None);
    // A message built on its own gets its trailer appended.
    let d = s.sealed(b"report".to_vec());
    assert_eq!(
        o.open(&mut d.to_vec(), NOW),
        Ok((Sender::instance(7), &b"report"[..]))
    );
}

#[test]
fn every_changed_byte_is_refused() {
    let r = ring(K1);
    let s = r.sealer(Sender::root(0), NOW - 1000).unwrap();
    let d = sealed(&s, b"a frame of the chain");
    for i in 0..d.len() {
        let mut o = r.opener(SKEW);
        let mut bad = d.clone();
        bad[i] ^= 0x40;
        let got = o.open(&mut bad, NOW).err();
        assert!(
            matches!(
                got,
                Some(
                    Rejected::BadTag | Rejected::UnknownKey | Rejected::Malformed | Rejected::Ahead
                )
            ),
            "byte {i}: {got:?}"
        );
    }
    let mut o = r.opener(SKEW);
    assert_eq!(
        o.open(&mut d[..TRAILER_LEN - 1].to_vec(), NOW),
        Err(Rejected::Malformed)
    );
    // One byte short: the trailer is read one byte early.
    assert!(o.open(&mut d[..d.len() - 1].to_vec(), NOW).is_err());
}

/// The trailer's nonce prefix and sequence number.
fn nonce_of(d: &[u8]) -> ([u8; 4], u64) {
    let h = &d[d.len() - TRAILER_LEN..];
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[12..20]);
    ([h[8], h[9], h[10], h[11]], u64::from_be_bytes(seq))
}

#[test]
fn every_flipped_bit_is_refused_for_its_reason() {
    let r = ring(K1);
    let s = r.sealer(Sender::instance(9), NOW - 1000).unwrap();
    let payload = b"a frame of the chain, longer than one block of anything";
    let d = sealed(&s, payload);
    let t = payload.len();
    for i in 0..d.len() {
        for bit in 0..8 {
            let mut o = r.opener(SKEW);
            let mut bad = d.clone();
            bad[i] ^= 1 << bit;
            let got = o.open(&mut bad.clone(), NOW).err();
            let want = match i - t.min(i) {
                // The role: another role's tag, or no role at all.
                0 if i >= t => {
                    if bad[i] == Role::Controller as u8 {
                        Rejected::BadTag
                    } else {
                        Rejected::Malformed
                    }
                }
                1 if i >= t => Rejected::UnknownKey,
                // A sequence number beyond the allowed skew is refused before the tag.
                12..20 if i >= t && nonce_of(&bad).1 > NOW + SKEW => Rejected::Ahead,
                // The datagram, reserved, sender, nonce prefix, sequence number, tag.
                _ => Rejected::BadTag,
            };
            assert_eq!(got, Some(want), "byte {i} bit {bit}");
            assert_eq!(o.rejected().get(want), 1);
            assert_eq!(o.accepted(), 0);
        }
    }
    assert!(r.opener(SKEW).open(&mut d.to_vec(), NOW).is_ok());
}

#[test]
fn a_tag_from_another_key_under_the_same_id_is_refused() {
    let mine = ring(K1);
    let theirs = ring("1 0f0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
    let s = mine.sealer(Sender::root(0), NOW - 100).unwrap();
    let d = sealed(&s, b"x");
    // The same datagram and trailer header sealed by the other key.
    let mut forged = b"x".to_vec();
    forged.extend_from_slice(&d[d.len() - TRAILER_LEN..]);
    let keys = theirs.inner.keys.load();
    let key = &keys.keys[0].1;
    let (prefix, seq) = nonce_of(&d);
    let (body, trailer) = forged.split_at_mut(1);
    let (h, tag) = trailer.split_at_mut(TRAILER_LEN - TAG_LEN);
    let t = key
        .seal_in_place_separate_tag(nonce(prefix, seq), aead::Aad::from(&*h), body)
        .unwrap();
    tag.copy_from_slice(t.as_ref());
    assert_ne!(forged, d);
    assert_eq!(
        mine.opener(SKEW).open(&mut forged.to_vec(), NOW),
        Err(Rejected::BadTag)
    );
    assert!(theirs.opener(SKEW).open(&mut forged.to_vec(), NOW).is_ok());
    assert_eq!(
        theirs.opener(SKEW).open(&mut d.to_vec(), NOW),
        Err(Rejected::BadTag)
    );
}

#[test]
fn two_sealers_of_one_sender_never_share_a_nonce() {
    // A cut-off instance and its replacement, started on the same clock reading.
    let r = ring(K1);
    let old = r.sealer(Sender::instance(4), NOW - 1000).unwrap();
    let new = r.sealer(Sender::instance(4), NOW - 1000).unwrap();
    let (a, b) = (sealed(&old, b"same"), sealed(&new, b"same"));
    let ((pa, sa), (pb, sb)) = (nonce_of(&a), nonce_of(&b));
    assert_eq!(sa, sb);
    // Fails once in 2^32 runs: both drew the same prefix.
    assert_ne!(pa, pb);
    assert_ne!(a[a.len() - TAG_LEN..], b[b.len() - TAG_LEN..]);
    for d in [&a, &b] {
        assert_eq!(
            r.opener(SKEW).open(&mut d.to_vec(), NOW),
            Ok((Sender::instance(4), &b"same"[..]))
        );
    }
    // One receiver still takes a sender's number once, whatever the nonce.
    let mut o = r.opener(SKEW);
    assert!(o.open(&mut a.to_vec(), NOW).is_ok());
    assert_eq!(o.open(&mut b.to_vec(), NOW), Err(Rejected::Replayed));
    // Clones share the prefix and the numbers.
    let c = sealed(&old.clone(), b"same");
    assert_eq!(nonce_of(&c), (pa, sa + 1));
}

#[test]
fn sequence_numbers_strictly_increase_whatever_the_clock_does() {
    let r = ring(K1);
    let s = r.sealer(Sender::root(0), NOW).unwrap();
    // Two threads on clones of one sealer: every number once, rising in each thread.
    let seqs: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                sc.spawn(move || {
                    (0..5000)
                        .map(|_| nonce_of(&sealed(&s, b"p")).1)
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for v in &seqs {
        assert!(v.windows(2).all(|w| w[0] < w[1]));
    }
    let all: BTreeSet<u64> = seqs.iter().flatten().copied().collect();
    assert_eq!(all.len(), 10_000);
    assert_eq!(all.first(), Some(&NOW));
    assert_eq!(all.last(), Some(&(NOW + 9_999)));
    // The clock steps back a second: a sealer made now numbers from below, but on a nonce
    // prefix of its own, so no nonce repeats; its sealer's numbers keep rising.
    let later = r.sealer(Sender::root(0), NOW - 1_000_000_000).unwrap();
    let (p_later, first) = nonce_of(&sealed(&later, b"p"));
    assert_eq!(first, NOW - 1_000_000_000);
    assert_ne!(p_later, nonce_of(&sealed(&s, b"p")).0);
    let mut last = first;
    for _ in 0..1000 {
        let (p, seq) = nonce_of(&sealed(&later, b"p"));
        assert_eq!(p, p_later);
        assert!(seq > last);
        last = seq;
    }
}

#[test]
fn a_sealer_stops_before_its_numbers_wrap() {
    let r = ring(K1);
    let s = r.sealer(Sender::root(0), u64::MAX - 1).unwrap();
    let mut buf = [0u8; 8 + TRAILER_LEN];
    assert_eq!(s.seal(&mut buf, 8), Some(buf.len()));
    assert_eq!(nonce_of(&buf).1, u64::MAX - 1);
    assert_eq!(s.seal(&mut buf, 8), Some(buf.len()));
    assert_eq!(nonce_of(&buf).1, u64::MAX);
    for _ in 0..3 {
        assert_eq!(s.seal(&mut buf, 8), None);
    }
}

#[test]
fn the_trailer_is_laid_out_as_documented() {
    let r = ring(K1);
    let s = r.sealer(Sender::instance(0x0102_0304), NOW).unwrap();
    let d = sealed(&s, b"body");
    assert_eq!(TRAILER_LEN, 36);
    assert_eq!(d.len(), 4 + 36);
    let h = &d[4..];
    assert_eq!(h[..8], [2, 1, 0, 0, 1, 2, 3, 4]);
    assert_eq!(nonce_of(&d).1, NOW);
    assert_eq!(h[12..20], NOW.to_be_bytes());
    // The datagram is encrypted in place, and opens to what was sealed.
    assert_ne!(d[..4], *b"body");
    let mut opened = d.clone();
    assert_eq!(
        r.opener(SKEW).open(&mut opened, NOW),
        Ok((Sender::instance(0x0102_0304), &b"body"[..]))
    );
    // Unauthenticated: the same trailer, a zero tag, the datagram as it was.
    let plain = KeyRing::fixed(Keys::unauthenticated());
    let d = sealed(&plain.sealer(Sender::root(0), NOW).unwrap(), b"body");
    assert_eq!(d.len(), 4 + 36);
    assert_eq!(d[..4], *b"body");
    assert_eq!(d[4..12], [1, 0, 0, 0, 0, 0, 0, 0]);
    assert!(d[4 + 20..].iter().all(|&b| b == 0));
}

#[test]
fn a_stranger_with_another_key_is_refused() {
    let theirs = ring("1 ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff");
    let d = sealed(
        &theirs.sealer(Sender::controller(0), NOW - 10).unwrap(),
        b"assignment",
    );
    let mut o = ring(K1).opener(SKEW);
    assert_eq!(o.open(&mut d.to_vec(), NOW), Err(Rejected::BadTag));
    let other_id = sealed(
        &ring(K2).sealer(Sender::controller(0), NOW - 10).unwrap(),
        b"x",
    );
    assert_eq!(
        o.open(&mut other_id.to_vec(), NOW),
        Err(Rejected::UnknownKey)
    );
}

#[test]
fn a_rotation_refuses_nothing() {
    // Step 1: every host holds both keys, the old one signs.
    let old_first = ring(&format!("{K1}\n{K2}\n"));
    // Step 2: some hosts already sign with the new one.
    let new_first = ring(&format!("{K2}\n{K1}\n"));
    let mut at_old = old_first.opener(SKEW);
    let mut at_new = new_first.opener(SKEW);
    let a = old_first.sealer(Sender::instance(1), NOW - 100).unwrap();
    let b = new_first.sealer(Sender::instance(2), NOW - 100).unwrap();
    for s in [&a, &b] {
        let d = sealed(s, b"x");
        assert!(at_old.open(&mut d.to_vec(), NOW).is_ok());
        assert!(at_new.open(&mut d.to_vec(), NOW).is_ok());
    }
    // Step 3: the old key is gone; what it signs is refused.
    let mut done = ring(K2).opener(SKEW);
    assert!(done.open(&mut sealed(&b, b"y"), NOW).is_ok());
    assert_eq!(
        done.open(&mut sealed(&a, b"y"), NOW),
        Err(Rejected::UnknownKey)
    );
}

#[test]
fn a_sequence_far_ahead_is_refused_not_adopted() {
    let r = ring(K1);
    let mut o = r.opener(SKEW);
    let real = r.sealer(Sender::instance(3), NOW - 50).unwrap();
    assert!(o.open(&mut sealed(&real, b"1"), NOW).is_ok());
    let liar = r.sealer(Sender::instance(3), u64::MAX - 5).unwrap();
    assert_eq!(o.open(&mut sealed(&liar, b"2"), NOW), Err(Rejected::Ahead));
    // The real sender goes on.
    assert!(o.open(&mut sealed(&real, b"3"), NOW).is_ok());
    // Within the skew is taken.
    let fast_clock = r.sealer(Sender::instance(4), NOW + SKEW).unwrap();
    assert!(o.open(&mut sealed(&fast_clock, b"4"), NOW).is_ok());
}

#[test]
fn a_restarted_sender_continues_above_its_old_numbers() {
    let r = ring(K1);
    let mut o = r.opener(SKEW);
    let first = r.sealer(Sender::instance(5), NOW - 10_000).unwrap();
    for _ in 0..3 {
        assert!(o.open(&mut sealed(&first, b"x"), NOW).is_ok());
    }
    let again = r.sealer(Sender::instance(5), NOW - 5_000).unwrap();
    assert!(o.open(&mut sealed(&again, b"x"), NOW).is_ok());
    // The old process's numbers are now below the window.
    assert_eq!(
        o.open(&mut sealed(&first, b"x"), NOW),
        Err(Rejected::TooOld)
    );
}

#[test]
fn reordering_within_the_window_is_taken_once() {
    let r = ring(K1);
    let s = r.sealer(Sender::root(0), NOW - 1_000_000).unwrap();
    let ds: Vec<Vec<u8>> = (0..300).map(|_| sealed(&s, b"p")).collect();
    let mut o = r.opener(SKEW);
    assert!(o.open(&mut ds[299].to_vec(), NOW).is_ok());
    assert!(o
        .open(&mut ds[299 - (WINDOW as usize - 1)].to_vec(), NOW)
        .is_ok());
    assert_eq!(
        o.open(&mut ds[299 - WINDOW as usize].to_vec(), NOW),
        Err(Rejected::TooOld)
    );
    assert!(o.open(&mut ds[200].to_vec(), NOW).is_ok());
    assert_eq!(o.open(&mut ds[200].to_vec(), NOW), Err(Rejected::Replayed));
}

#[test]
fn unauthenticated_checks_the_sequence_only() {
    let r = KeyRing::fixed(Keys::unauthenticated());
    assert!(!r.authenticated());
    let s = r.sealer(Sender::root(0), NOW - 10).unwrap();
    let d = sealed(&s, b"x");
    assert!(d[d.len() - TAG_LEN..].iter().all(|&b| b == 0));
    let mut o = r.opener(SKEW);
    assert!(o.open(&mut d.to_vec(), NOW).is_ok());
    assert_eq!(o.open(&mut d.to_vec(), NOW), Err(Rejected::Replayed));
    // A keyed receiver refuses it.
    assert!(ring(K1).opener(SKEW).open(&mut d.to_vec(), NOW).is_err());
}

#[test]
fn senders_are_bounded() {
    let r = KeyRing::fixed(Keys::unauthenticated());
    let mut o = r.opener(SKEW);
    for id in 0..MAX_SENDERS as u32 {
        assert!(o
            .open(
                &mut sealed(&r.sealer(Sender::instance(id), 1).unwrap(), b""),
                NOW
            )
            .is_ok());
    }
    let one_more = sealed(&r.sealer(Sender::instance(u32::MAX), 1).unwrap(), b"");
    assert_eq!(
        o.open(&mut one_more.to_vec(), NOW),
        Err(Rejected::TooManySenders)
    );
    assert_eq!(o.rejected().by_name().get("too_many_senders"), Some(&1));
}

#[test]
fn key_files_name_the_line_and_refuse_loose_permissions() {
    for (text, line) in [
        ("", 0),
        ("# only a comment\n", 0),
        ("1 00", 1),
        (&format!("{K1}\n1 {}", "ab".repeat(32)), 2),
        ("x 0011", 1),
        (&format!("{K1} extra"), 1),
        (&format!("1 {}", "zz".repeat(32)), 1),
    ] {
        assert_eq!(Keys::parse(text).unwrap_err().0, line, "{text:?}");
    }
    let five: String = (1..=5)
        .map(|i| format!("{i} {}\n", "00".repeat(32)))
        .collect();
    assert_eq!(Keys::parse(&five).unwrap_err().0, 5);
    let keys = Keys::parse(&format!("# the cluster's keys\n{K2}  # new\n\n{K1}\n")).unwrap();
    assert_eq!(keys.ids(), vec![2, 1]);
    assert!(!format!("{keys:?}").contains("f0e0"));

    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.key");
    std::fs::write(&path, format!("{}\n", generate_line(9).unwrap())).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Keys::read(&path).unwrap_err();
    assert!(
        matches!(e, KeyError::Permissions { mode: 0o644, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("chmod 600"), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(Keys::read(&path).unwrap().ids(), vec![9]);
}

#[test]
fn a_changed_key_file_reaches_every_sealer() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.key");
    let write = |text: &str| {
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    write(&format!("{K1}\n"));
    let r = KeyRing::open(&path).unwrap();
    let s = r.sealer(Sender::root(0), NOW - 100).unwrap();
    let d = sealed(&s, b"x");
    assert_eq!(d[d.len() - TRAILER_LEN + 1], 1);
    // The modification time must differ from the first read's.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(&format!("{K2}\n{K1}\n"));
    r.reload_if_changed();
    assert_eq!(r.ids(), vec![2, 1]);
    let d = sealed(&s, b"x");
    assert_eq!(d[d.len() - TRAILER_LEN + 1], 2);
    // A broken file keeps the keys in use.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write("1 nonsense\n");
    r.reload_if_changed();
    assert_eq!(r.ids(), vec![2, 1]);
}

/// The window against a set of every number taken, over [`WINDOW`].
#[derive(Default)]
struct Naive {
    taken: BTreeSet<u64>,
}

impl Naive {
    fn offer(&mut self, seq: u64) -> Result<(), Rejected> {
        let top = self.taken.last().copied();
        if let Some(top) = top {
            if seq <= top && top - seq >= WINDOW {
                return Err(Rejected::TooOld);
            }
        }
        if !self.taken.insert(seq) {
            return Err(Rejected::Replayed);
        }
        Ok(())
    }
}

proptest! {
    #[test]
    fn the_window_agrees_with_a_set_of_every_number_taken(
        steps in proptest::collection::vec((any::<bool>(), 0u64..700), 1..400)
    ) {
        let mut w: Option<Window> = None;
        let mut naive = Naive::default();
        let mut top = 10_000u64;
        for (forward, d) in steps {
            let seq = if forward { top + d } else { top.saturating_sub(d) };
            top = top.max(seq);
            let got = match &mut w {
                None => {
                    let mut n = Window::default();
                    n.take(seq);
                    w = Some(n);
                    Ok(())
                }
                Some(w) => w.check(seq).map(|()| w.take(seq)),
            };
            prop_assert_eq!(got, naive.offer(seq), "seq {}", seq);
        }
    }

    #[test]
    fn any_bytes_are_refused_without_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut o = ring(K1).opener(SKEW);
        prop_assert!(o.open(&mut b.to_vec(), NOW).is_err());
        let mut plain = KeyRing::fixed(Keys::unauthenticated()).opener(SKEW);
        let _ = plain.open(&mut b.to_vec(), u64::MAX);
    }
}
