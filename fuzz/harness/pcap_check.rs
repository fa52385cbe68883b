//! The checks of the `pcap` fuzz target, on one input, shared by the cargo-fuzz target
//! (`fuzz/fuzz_targets/pcap.rs`) and its stable harness (`crates/io/tests/fuzz_pcap.rs`).

use flowstate_io::pcap::{PcapReader, MAX_CAPLEN};
use flowstate_io::{PacketBatch, PacketMeta, Source};

pub(crate) type Packets = Vec<(Vec<u8>, PacketMeta)>;

/// `recv` in batches of `cap` (buffers of `MAX_CAPLEN`: nothing truncated): the packets and
/// the error's text.
pub(crate) fn by_batches(bytes: &[u8], cap: usize) -> (Packets, Option<String>) {
    let mut r = match PcapReader::new(bytes, "fuzz.pcap") {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let mut batch = PacketBatch::new(cap, MAX_CAPLEN as usize);
    let mut out = Vec::new();
    // Every call that returns packets consumes at least one record of 12 or more bytes.
    for _ in 0..=bytes.len() / 12 + 1 {
        match r.recv(&mut batch) {
            Ok(0) => return (out, None),
            Ok(n) => {
                assert_eq!(n, batch.len());
                out.extend(batch.iter().map(|(d, m)| (d.to_vec(), *m)));
            }
            Err(e) => {
                let again = r.recv(&mut batch).expect_err("an error repeats");
                assert_eq!(again.to_string(), e.to_string());
                return (out, Some(e.to_string()));
            }
        }
    }
    panic!("recv did not end");
}

/// Everything checked on one input.
pub(crate) fn check(bytes: &[u8]) {
    let (packets, error) = match PcapReader::new(bytes, "fuzz.pcap") {
        Err(e) => (Vec::new(), Some(e.to_string())),
        Ok(mut r) => {
            let mut out = Vec::new();
            let error = loop {
                match r.next_packet() {
                    Ok(Some((d, m))) => {
                        assert!(d.len() <= MAX_CAPLEN as usize);
                        let _ = flowstate_wire::dissect::dissect(d);
                        out.push((d.to_vec(), m));
                        assert!(out.len() <= bytes.len() / 12, "more records than bytes");
                    }
                    Ok(None) => break None,
                    Err(e) => {
                        let again = r.next_packet().expect_err("an error repeats");
                        assert_eq!(again.to_string(), e.to_string());
                        break Some(e.to_string());
                    }
                }
            };
            assert_eq!(r.records_read(), out.len() as u64);
            assert!(r.bytes_read() <= bytes.len() as u64);
            (out, error)
        }
    };
    for cap in [1, 7] {
        let (p, e) = by_batches(bytes, cap);
        assert_eq!(p, packets, "recv({cap}) vs next_packet");
        assert_eq!(e, error, "recv({cap}) vs next_packet");
    }
}
