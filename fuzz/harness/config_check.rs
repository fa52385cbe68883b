//! The checks of the `config` fuzz target, on one file, shared by the cargo-fuzz target
//! (`fuzz/fuzz_targets/config.rs`) and its stable harness (`crates/cli/src/check_fuzz.rs`);
//! both have `flowstate check`'s loader as `crate::check`.

use crate::check;
use std::path::Path;

/// Everything checked on one file: `text`, written to `path` and loaded twice.
pub(crate) fn check(path: &Path, text: &[u8]) {
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
            assert!(!errors.is_empty(), "an error without an error");
            let show = |e: &flowstate_deploy::ConfigErrors| {
                e.iter()
                    .map(|e| (e.line, e.key.clone(), e.reason.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(show(&errors), show(&again), "loading twice differs");
            for e in errors.iter() {
                assert_eq!(e.file, path);
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
        (a, b) => panic!(
            "loading twice differs: {:?} then {:?}",
            a.err().map(|e| e.to_string()),
            b.err().map(|e| e.to_string())
        ),
    }
}
