//! Fuzzes configuration files through `flowstate check`'s loader itself (`crates/cli/src/
//! check.rs` and the store settings of `backends.rs`, compiled in here: the binary has no
//! library): the bytes are written to a file and loaded as `check`, `run` and `cluster up`
//! load one. Nothing may panic; when the text is TOML every error names a key and a line of
//! the file; loading twice gives the same errors. The stable harness with the same checks,
//! and with TOML-aware mutations, is `crates/cli/src/check_fuzz.rs`.
//!
//! Run with `cargo +nightly fuzz run config` from `fuzz/`'s parent (seeds:
//! `fuzz/corpus/config`).

#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../crates/cli/src/backends.rs"]
mod backends;
#[allow(dead_code, unused_imports)]
#[path = "../../crates/cli/src/check.rs"]
mod check;

#[path = "../harness/config_check.rs"]
mod config_check;

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("flowstate-fuzz-{}.toml", std::process::id()))
    })
}

fuzz_target!(|text: &[u8]| config_check::check(path(), text));
