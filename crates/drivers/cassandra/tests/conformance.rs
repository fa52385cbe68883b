//! The backend conformance suite against a real Cassandra (`scripts/cassandra start`).
//!
//! The node is `FLOWSTATE_CASSANDRA` (`host:port`, default `127.0.0.1:9042`). Without one the
//! test prints why and passes, except in CI (`CI=true`), where a missing Cassandra fails.

use flowstate_driver_cassandra::{CassandraConfig, CassandraConnector, DEFAULT_NODE};
use flowstate_state::conformance::{self, Options};
use std::time::Instant;

fn connector() -> Option<CassandraConnector> {
    let addr = std::env::var("FLOWSTATE_CASSANDRA").unwrap_or_else(|_| DEFAULT_NODE.to_string());
    match CassandraConnector::new(CassandraConfig::node(&addr)) {
        Ok(c) => Some(c),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but no Cassandra at {addr} ({e}); scripts/test starts one with scripts/cassandra start")
        }
        Err(e) => {
            eprintln!("skipping the Cassandra conformance suite: {e} (start one with scripts/cassandra start)");
            None
        }
    }
}

#[test]
fn conformance_suite_on_real_cassandra() {
    let Some(c) = connector() else { return };
    let pid = format!("-{}-", std::process::id());
    let started = Instant::now();
    let mut failed = Vec::new();
    for (name, _) in conformance::CHECKS {
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            conformance::run_check_with(&c, name, &Options::WHOLE_SECONDS)
        }));
        eprintln!(
            "conformance {name}: {} in {:.1?}",
            if r.is_ok() { "ok" } else { "FAILED" },
            t.elapsed()
        );
        if r.is_err() {
            failed.push(*name);
        }
    }
    eprintln!("conformance suite on cassandra: {:.1?}", started.elapsed());
    // Only this process's namespaces: other runs may be going on beside it.
    let dropped = c
        .drop_nfs(|nf| nf.starts_with("conf-") && nf.contains(&pid))
        .expect("drop the suite's keyspaces");
    eprintln!("dropped {dropped} keyspaces");
    assert!(failed.is_empty(), "failed checks: {failed:?}");
}
