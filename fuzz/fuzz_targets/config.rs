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

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("flowstate-fuzz-{}.toml", std::process::id()))
    })
}

fuzz_target!(|text: &[u8]| {
    let path = path();
    std::fs::write(path, text).expect("writing the file");
    let first = check::load(path);
    let again = check::load(path);
    let lines = text.split(|&b| b == b'\n').count();
    let is_toml = std::str::from_utf8(text)
        .ok()
        .is_some_and(|s| s.parse::<toml::Table>().is_ok());
    match (first, again) {
        (Ok(loaded), Ok(_)) => {
            let _ = check::summary(&loaded);
        }
        (Err(errors), Err(again)) => {
            assert!(!errors.is_empty());
            let show = |e: &flowstate_chain::ConfigErrors| {
                e.iter()
                    .map(|e| (e.line, e.key.clone(), e.reason.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(show(&errors), show(&again), "loading twice differs");
            for e in errors.iter() {
                assert!(!e.reason.is_empty(), "{e}");
                if is_toml {
                    assert!(
                        !e.key.is_empty(),
                        "an error of a TOML file names no key: {e}"
                    );
                }
                if let Some(l) = e.line {
                    assert!(l >= 1 && l <= lines, "line {l} of {lines}: {e}");
                }
            }
        }
        _ => panic!("loading twice differs"),
    }
});
