//! Fuzzes the capture reader (`flowstate_io::pcap`) on classic pcap and pcapng bytes: nothing
//! may panic; `next_packet` and `recv` in batches of 1 and 7 give the same packets and the
//! same error; an error repeats; no packet is longer than `MAX_CAPLEN`; every packet is
//! dissected, as `flowstate inspect` does. The stable harness with the same checks is
//! `crates/io/tests/fuzz_pcap.rs`.
//!
//! Run with `cargo +nightly fuzz run pcap` from `fuzz/`'s parent (seeds: `fuzz/corpus/pcap`).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/pcap_check.rs"]
mod pcap_check;

fuzz_target!(|bytes: &[u8]| pcap_check::check(bytes));
