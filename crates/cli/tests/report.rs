//! `flowstate report`: the page built from the committed sample results
//! (`crates/bench/testdata`, written by real `flowstate bench NAME --quick` runs) as a browser
//! renders it — headless Chromium's DOM and a screenshot — and the command's errors.

mod common;

use common::{chromium, headless, png_pixels};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn flowstate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(args)
        .output()
        .expect("run flowstate")
}

fn samples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/testdata")
}

/// The committed samples by bench name: each key's values over the bench's files.
fn sample_ratios() -> BTreeMap<String, BTreeMap<String, Vec<f64>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for entry in std::fs::read_dir(samples()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = v["name"].as_str().unwrap().to_owned();
        let ratios = out.entry(name).or_default();
        for (k, x) in v["ratios"].as_object().unwrap() {
            if let Some(x) = x.as_f64() {
                ratios.entry(k.clone()).or_default().push(x);
            }
        }
    }
    out
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[test]
fn report_of_the_samples_renders_in_headless_chromium() {
    let benches = sample_ratios();
    assert!(benches.len() >= 4, "samples: {:?}", benches.keys());
    assert!(
        benches["hashing"].values().all(|v| v.len() == 3),
        "hashing is sampled three times (median and spread)"
    );

    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let out = flowstate(&[
        "report",
        samples().to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(
        stderr.contains(&format!("{} benches", benches.len())),
        "{stderr}"
    );

    let Some(browser) = chromium() else { return };
    let profile = dir.path().join("profile");

    // The DOM as Chromium parsed it.
    let url = format!("file://{}", page.display());
    let dom = headless(&[], browser, &profile, &["--dump-dom"], &url);
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8(dom.stdout).unwrap();
    let sections: Vec<&str> = dom.split("<section class=\"bench\"").skip(1).collect();
    assert_eq!(sections.len(), benches.len(), "one section per bench");
    for (name, ratios) in &benches {
        let section = sections
            .iter()
            .find(|s| s.contains(&format!("data-bench=\"{name}\"")))
            .unwrap_or_else(|| panic!("no section for {name}"));
        let section = &section[..section.find("</section>").expect("section closed")];
        assert!(
            section.contains(&format!("<h2>{name}</h2>")),
            "{name}: heading"
        );
        // A plot, inline, with the bench's numbers as SVG text.
        assert!(section.contains("<figure class=\"plot\""), "{name}: plot");
        let svg = &section[section.find("<svg").expect("an svg plot")..];
        let svg = &svg[..svg.find("</svg>").expect("svg closed")];
        assert!(svg.contains("<text"), "{name}: the plot has text");
        for (key, values) in ratios {
            let shown = flowstate_bench::html::fmt_num(median(values));
            assert!(
                section.contains(&format!("<code>{key}</code>")),
                "{name}: {key} listed"
            );
            assert!(
                section.contains(&shown),
                "{name}: {key}'s median {shown} shown"
            );
        }
        assert!(section.contains("Machine"), "{name}: the machine");
    }
    // Beside the paper: HashMVT's 5× hardware CRC32C next to the measured median of 3 runs.
    assert!(dom.contains("HashMVT §VI-C"));
    assert!(dom.contains("paper 5"));
    assert!(dom.contains("median of 3 runs"));

    // The page as Chromium draws it: the viewport holds the heading and the first plots.
    let shot = dir.path().join("shot.png");
    let out = headless(
        &[],
        browser,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,2000",
        ],
        &url,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (width, height, pixels) = png_pixels(&shot);
    assert_eq!((width, height), (1400, 2000));
    let mut colours = std::collections::HashSet::new();
    let (mut measured, mut paper) = (0usize, 0usize);
    for rgb in pixels {
        colours.insert(rgb);
        if rgb == (52, 101, 164) {
            measured += 1;
        }
        if rgb == (230, 140, 30) {
            paper += 1;
        }
    }
    eprintln!(
        "screenshot: {} colours, {measured} pixels of measured bars, {paper} of the paper's",
        colours.len()
    );
    assert!(
        colours.len() > 20,
        "a blank page: {} colours",
        colours.len()
    );
    assert!(measured > 1000, "measured bars drawn: {measured} pixels");
    assert!(paper > 200, "the paper's bars drawn: {paper} pixels");
}

#[test]
fn report_errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let out = flowstate(&["report", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-dir"), "{err}");

    let out = flowstate(&["report", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no *.json files"), "{err}");

    // A malformed file beside a good one: skipped with a warning naming it, or fatal with
    // --strict.
    std::fs::copy(
        samples().join("hashing-1.json"),
        dir.path().join("hashing.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("half.json"), "{\"name\": \"chc\", \"metr").unwrap();
    let out = flowstate(&["report", dir.path().to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains("half.json"),
        "{err}"
    );
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("half.json") && html.contains("data-bench=\"hashing\""));

    let out = flowstate(&["report", "--strict", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("half.json") && err.contains("not JSON"),
        "{err}"
    );
}
