//! Fuzzes the state store protocol's decoder as a server meets it: frames back to back in one
//! buffer, under default and tight limits. Nothing may panic; every frame that decodes must
//! encode to bytes that decode to the same frame; the borrowed batch decoder (the server's hot
//! path) must agree with the owned one on every batch frame.
//!
//! Run with `cargo +nightly fuzz run proto` from the repository root.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/proto_check.rs"]
mod proto_check;

fuzz_target!(|data: &[u8]| proto_check::check(data));
