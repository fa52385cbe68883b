//! `flowstate bench soak`: the JSON a short run writes, and that its ratio is computed from its
//! RSS samples (not whether memory stayed flat: a short run on a shared machine says little;
//! BENCHMARKS.md has the long runs).

use std::process::{Command, Output};

fn flowstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(args)
        .output()
        .expect("run flowstate")
}

#[test]
fn quick_soak_reports_rss_from_its_samples() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("soak.json");
    let out = flowstate(&["bench", "soak", "--quick", "--json", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["name"], "soak");
    assert!(v["params"].get("error").is_none(), "{v}");
    let metric = |k: &str| {
        v["metrics"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("metrics.{k} in {v}"))
    };
    let ratio = |k: &str| {
        v["ratios"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("ratios.{k} in {v}"))
    };
    // The samples: one after the warm-up, the last at the end, in order of time.
    let samples: Vec<f64> = v["params"]["rss_samples_mb"]
        .as_array()
        .expect("params.rss_samples_mb")
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let times: Vec<f64> = v["params"]["sample_wall_s"]
        .as_array()
        .expect("params.sample_wall_s")
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert!(samples.len() >= 2, "{v}");
    assert_eq!(samples.len(), times.len());
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(samples.iter().all(|&s| s > 0.0), "{samples:?}");
    let (start, end, max) = (
        metric("rss_mb_start"),
        metric("rss_mb_end"),
        metric("rss_mb_max"),
    );
    assert!((start - samples[0]).abs() <= 0.05, "{start} vs {samples:?}");
    assert!(
        (end - samples[samples.len() - 1]).abs() <= 0.05,
        "{end} vs {samples:?}"
    );
    let biggest = samples.iter().copied().fold(0.0, f64::max);
    assert!((max - biggest).abs() <= 0.05, "{max} vs {samples:?}");
    assert!((ratio("rss_end_vs_start") - end / start).abs() < 1e-9);
    assert!((ratio("rss_max_vs_start") - max / start).abs() < 1e-9);
    assert!(metric("wall_s_start") < metric("wall_s_end"));
    assert!(metric("packet_clock_s_start") < metric("packet_clock_s_end"));
    // The chain ran with churn: flows made, answered, tracked by every NF.
    for k in [
        "flows_created",
        "packets_in",
        "reflected",
        "mpps",
        "nat_sessions_end",
        "firewall_tracked_end",
        "firewall_conns_opened",
        "lb_flows_end",
    ] {
        assert!(metric(k) > 0.0, "metrics.{k} in {v}");
    }
    // Reported, not asserted: which of the soak's packets an NF drops is the NF's business.
    assert!(metric("dropped") >= 0.0);
}

#[test]
fn duration_is_for_the_soak_only_and_needs_a_unit() {
    let out = flowstate(&["bench", "hashing", "--duration", "1s"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
    let out = flowstate(&["bench", "soak", "--duration", "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--duration") && err.contains("unit"), "{err}");
}
