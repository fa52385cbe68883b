//! Fuzzes the capture reader (`flowstate_io::pcap`) on classic pcap and pcapng bytes: nothing
//! may panic; `next_packet` and `recv` in batches of 1 and 7 give the same packets and the
//! same error; an error repeats; no packet is longer than `MAX_CAPLEN`; every packet is
//! dissected, as `flowstate inspect` does. The stable harness with the same checks is
//! `crates/io/tests/fuzz_pcap.rs`.
//!
//! Run with `cargo +nightly fuzz run pcap` from `fuzz/`'s parent (seeds: `fuzz/corpus/pcap`).

#![no_main]

use flowstate_io::pcap::{PcapReader, MAX_CAPLEN};
use flowstate_io::{PacketBatch, PacketMeta, Source};
use libfuzzer_sys::fuzz_target;

type Packets = Vec<(Vec<u8>, PacketMeta)>;

fn by_batches(bytes: &[u8], cap: usize) -> (Packets, Option<String>) {
    let mut r = match PcapReader::new(bytes, "fuzz.pcap") {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let mut batch = PacketBatch::new(cap, MAX_CAPLEN as usize);
    let mut out = Vec::new();
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

fuzz_target!(|bytes: &[u8]| {
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
});
