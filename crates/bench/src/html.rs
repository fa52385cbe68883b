//! `flowstate report`: one self-contained HTML page from a directory of bench JSON files.
//!
//! Promises:
//! * The page needs nothing but itself: CSS inline, plots inline SVG drawn by `plotters`'
//!   SVG backend without font files (text is SVG `<text>`, the browser picks the font), no
//!   script, no external asset.
//! * One `<section class="bench">` per bench name, in `flowstate bench --list` order, then
//!   names we do not know (a generic section: their numbers, no paper figure). Each section
//!   starts with a plot of its ratios (or, without ratios, of its first group of metrics),
//!   the measured median beside the paper's number where `crate::paper` has one, and the
//!   machine the runs were on.
//! * Several files of one bench (repeated runs) are one section: bars are medians, whiskers
//!   the smallest and largest run (BENCHMARKS.md reports medians of three runs or more).
//! * Files that are not a bench result (not JSON, no `name`, no `metrics`/`ratios`, a value
//!   that is not a number) are skipped and named, on the page and in `Loaded::skipped`: a
//!   results directory where one bench died mid-write still gives a report of the others.
//!   A directory with no usable file at all is an error.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why no report could be built.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The results directory could not be read.
    #[error("results directory {}: {source}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What reading it said.
        source: std::io::Error,
    },
    /// The directory holds no `*.json` file.
    #[error(
        "results directory {}: no *.json files in it (`flowstate bench NAME --json {}/NAME.json` writes one)",
        path.display(),
        path.display()
    )]
    NoJson {
        /// The directory.
        path: PathBuf,
    },
    /// Every `*.json` file was malformed.
    #[error("results directory {}: none of its {count} *.json files is a bench result; {}: {first}", path.display(), first_file.display())]
    NoneValid {
        /// The directory.
        path: PathBuf,
        /// How many JSON files it holds.
        count: usize,
        /// The first file skipped.
        first_file: PathBuf,
        /// Why it was skipped.
        first: String,
    },
    /// A file was malformed (only from [`parse_run`] callers that treat it as fatal).
    #[error("{}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `plotters` failed to draw (should not happen with the SVG backend).
    #[error("drawing a plot: {0}")]
    Plot(String),
}

/// One bench result file.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Where it was read from.
    pub file: PathBuf,
    /// The bench's name.
    pub name: String,
    /// Its parameters as written.
    pub params: BTreeMap<String, Value>,
    /// Its metrics; `None` where the file has `null` (a non-finite number when written).
    pub metrics: BTreeMap<String, Option<f64>>,
    /// Its ratios, the same way.
    pub ratios: BTreeMap<String, Option<f64>>,
    /// The machine it ran on, as written (fields vary between versions).
    pub machine: BTreeMap<String, Value>,
}

/// What a results directory held.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The directory.
    pub dir: PathBuf,
    /// Every usable result, ordered by file name.
    pub runs: Vec<Run>,
    /// Files skipped, with the reason.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Parses one bench result; the error says what is wrong with it.
pub fn parse_run(file: &Path, text: &str) -> Result<Run, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(top) = v else {
        return Err("not a bench result: the JSON is not an object".into());
    };
    let name = match top.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(_) => return Err("not a bench result: `name` is not a non-empty string".into()),
        None => return Err("not a bench result: no `name`".into()),
    };
    if !top.contains_key("metrics") && !top.contains_key("ratios") {
        return Err("not a bench result: neither `metrics` nor `ratios`".into());
    }
    let numbers = |field: &str| -> Result<BTreeMap<String, Option<f64>>, String> {
        let mut out = BTreeMap::new();
        match top.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let x = match v {
                        Value::Number(n) => n.as_f64(),
                        Value::Null => None,
                        other => {
                            return Err(format!(
                                "`{field}.{k}` is {other}, not a number (bench results are flat maps of numbers)"
                            ))
                        }
                    };
                    out.insert(k.clone(), x);
                }
            }
            Some(_) => return Err(format!("`{field}` is not an object")),
        }
        Ok(out)
    };
    let object = |field: &str| -> Result<BTreeMap<String, Value>, String> {
        match top.get(field) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            Some(_) => Err(format!("`{field}` is not an object")),
        }
    };
    Ok(Run {
        file: file.to_owned(),
        name,
        metrics: numbers("metrics")?,
        ratios: numbers("ratios")?,
        params: object("params")?,
        machine: object("machine")?,
    })
}

/// Reads every `*.json` file directly in `dir` (not below it), skipping the malformed ones.
pub fn load_dir(dir: &Path) -> Result<Loaded, ReportError> {
    let dir_err = |source| ReportError::Dir {
        path: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(dir_err)? {
        let path = entry.map_err(dir_err)?.path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(ReportError::NoJson {
            path: dir.to_owned(),
        });
    }
    let mut loaded = Loaded {
        dir: dir.to_owned(),
        ..Loaded::default()
    };
    for file in &files {
        let parsed = std::fs::read_to_string(file)
            .map_err(|e| format!("unreadable: {e}"))
            .and_then(|text| parse_run(file, &text));
        match parsed {
            Ok(run) => loaded.runs.push(run),
            Err(reason) => loaded.skipped.push((file.clone(), reason)),
        }
    }
    if loaded.runs.is_empty() {
        let (first_file, first) = loaded.skipped.swap_remove(0);
        return Err(ReportError::NoneValid {
            path: dir.to_owned(),
            count: files.len(),
            first_file,
            first,
        });
    }
    Ok(loaded)
}

/// Median, smallest and largest of one key over a bench's runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Runs with a number for this key.
    pub n: usize,
}

impl Stat {
    /// The statistics of `values`, `None` when empty.
    pub fn of(values: &[f64]) -> Option<Stat> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }
}

/// Every key of one map (`metrics` or `ratios`) over runs, with its statistics.
fn stats<'a>(
    runs: &[&'a Run],
    pick: impl Fn(&'a Run) -> &'a BTreeMap<String, Option<f64>>,
) -> BTreeMap<&'a str, Option<Stat>> {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for (k, v) in pick(run) {
            let e = values.entry(k.as_str()).or_default();
            if let Some(x) = v {
                e.push(*x);
            }
        }
    }
    values.into_iter().map(|(k, v)| (k, Stat::of(&v))).collect()
}

/// A number as a person reads it: three significant digits, thousands separated.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "—".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if a >= 1e4 {
        let digits = format!("{:.0}", a);
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return if v < 0.0 { format!("-{out}") } else { out };
    }
    if a >= 100.0 {
        return format!("{v:.0}");
    }
    let decimals = (2 - a.log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

fn stat_text(s: &Stat) -> String {
    if s.n > 1 && s.min != s.max {
        format!(
            "{} [{}–{}]",
            fmt_num(s.median),
            fmt_num(s.min),
            fmt_num(s.max)
        )
    } else {
        fmt_num(s.median)
    }
}

/// HTML-escapes `s`.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One row of a bar chart.
#[derive(Debug, Clone)]
pub struct Bar {
    /// The key, as the bench writes it.
    pub key: String,
    /// The measured statistics (`None`: the runs wrote `null`).
    pub measured: Option<Stat>,
    /// The paper's value, if known.
    pub paper: Option<f64>,
}

const MEASURED: RGBColor = RGBColor(52, 101, 164);
const PAPER: RGBColor = RGBColor(230, 140, 30);
const ROW: u32 = 26;
const WIDTH: u32 = 820;

fn plot_err<E: std::fmt::Display>(e: E) -> ReportError {
    ReportError::Plot(e.to_string())
}

/// A horizontal bar chart on a log scale, one row per key: the measured median (whiskers:
/// smallest and largest run) and, below it, the paper's value. Values ≤ 0 cannot be drawn on
/// a log scale; their numbers are still written beside the row.
pub fn bar_chart(title: &str, bars: &[Bar], runs: usize) -> Result<String, ReportError> {
    let n = bars.len().max(1);
    let height = 74 + ROW * n as u32 + 34;
    let mut positives: Vec<f64> = Vec::new();
    for b in bars {
        if let Some(s) = b.measured {
            positives.extend([s.median, s.min, s.max]);
        }
        positives.extend(b.paper);
    }
    positives.retain(|x| x.is_finite() && *x > 0.0);
    let (lo, hi) = if positives.is_empty() {
        (0.1, 10.0)
    } else {
        let min = positives.iter().copied().fold(f64::INFINITY, f64::min);
        let max = positives.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut lo = 10f64.powf(min.log10().floor());
        let mut hi = 10f64.powf(max.log10().ceil());
        if hi <= lo * 10.0 {
            lo /= 10f64.sqrt();
            hi *= 10f64.sqrt();
        }
        (lo, hi)
    };
    let longest = bars
        .iter()
        .map(|b| b.key.chars().count())
        .max()
        .unwrap_or(8);
    let left = (longest as u32 * 7 + 14).clamp(80, 340);
    let right = 190;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let font = |size: u32| ("sans-serif", size).into_font();
        root.draw(&Text::new(
            title.to_owned(),
            (10, 8),
            font(15).style(FontStyle::Bold),
        ))
        .map_err(plot_err)?;
        legend(&root, bars.iter().any(|b| b.paper.is_some()), runs)?;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(58)
            .margin_right(right)
            .margin_left(6)
            .margin_bottom(6)
            .x_label_area_size(34)
            .y_label_area_size(left)
            .build_cartesian_2d((lo..hi).log_scale(), -0.5..(n as f64 - 0.5))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(8)
            .x_label_formatter(&|v| fmt_num(*v))
            .x_label_style(font(11))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(plot_err)?;
        if lo < 1.0 && hi > 1.0 {
            chart
                .draw_series(LineSeries::new(
                    [(1.0, -0.5), (1.0, n as f64 - 0.5)],
                    RGBColor(150, 150, 150).stroke_width(1),
                ))
                .map_err(plot_err)?;
        }
        let label = TextStyle::from(font(12)).pos(Pos::new(HPos::Right, VPos::Center));
        let value = TextStyle::from(font(11)).pos(Pos::new(HPos::Left, VPos::Center));
        let paper_value = font(11)
            .color(&RGBColor(170, 95, 0))
            .pos(Pos::new(HPos::Left, VPos::Center));
        for (i, b) in bars.iter().enumerate() {
            // First key at the top.
            let y = (n - 1 - i) as f64;
            let (my0, my1) = if b.paper.is_some() {
                (y + 0.02, y + 0.38)
            } else {
                (y - 0.25, y + 0.25)
            };
            if let Some(s) = b.measured.filter(|s| s.median > 0.0) {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(lo, my0), (s.median, my1)],
                        MEASURED.filled(),
                    )))
                    .map_err(plot_err)?;
                if s.n > 1 && s.min > 0.0 && s.max > s.min {
                    let mid = (my0 + my1) / 2.0;
                    let cap = (my1 - my0) / 3.0;
                    let black = BLACK.stroke_width(1);
                    for seg in [
                        [(s.min, mid), (s.max, mid)],
                        [(s.min, mid - cap), (s.min, mid + cap)],
                        [(s.max, mid - cap), (s.max, mid + cap)],
                    ] {
                        chart
                            .draw_series(LineSeries::new(seg, black))
                            .map_err(plot_err)?;
                    }
                }
            }
            if let Some(p) = b.paper.filter(|p| *p > 0.0) {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(lo, y - 0.38), (p, y - 0.02)],
                        PAPER.filled(),
                    )))
                    .map_err(plot_err)?;
            }
            let (px, py) = chart.backend_coord(&(lo, y));
            let mut key = b.key.clone();
            if key.chars().count() > 48 {
                key = key.chars().take(47).collect::<String>() + "…";
            }
            root.draw(&Text::new(key, (px - 6, py), label.clone()))
                .map_err(plot_err)?;
            let (rx, _) = chart.backend_coord(&(hi, y));
            let measured = b.measured.as_ref().map_or("—".to_owned(), stat_text);
            match b.paper {
                Some(p) => {
                    let (_, top) = chart.backend_coord(&(hi, y + 0.2));
                    let (_, bottom) = chart.backend_coord(&(hi, y - 0.2));
                    root.draw(&Text::new(measured, (rx + 8, top), value.clone()))
                        .map_err(plot_err)?;
                    root.draw(&Text::new(
                        format!("paper {}", fmt_num(p)),
                        (rx + 8, bottom),
                        paper_value.clone(),
                    ))
                    .map_err(plot_err)?;
                }
                None => {
                    root.draw(&Text::new(measured, (rx + 8, py), value.clone()))
                        .map_err(plot_err)?;
                }
            }
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn legend(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    with_paper: bool,
    runs: usize,
) -> Result<(), ReportError> {
    let font = ("sans-serif", 12).into_font();
    let what = if runs > 1 {
        format!("measured: median of {runs} runs, whiskers smallest–largest")
    } else {
        "measured (one run)".to_owned()
    };
    root.draw(&Rectangle::new([(10, 32), (24, 44)], MEASURED.filled()))
        .map_err(plot_err)?;
    root.draw(&Text::new(what, (30, 32), font.clone()))
        .map_err(plot_err)?;
    if with_paper {
        root.draw(&Rectangle::new([(420, 32), (434, 44)], PAPER.filled()))
            .map_err(plot_err)?;
        root.draw(&Text::new("the paper's number", (440, 32), font))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// The unit a metric's name says it is in (its first unit-like word), for grouping metrics
/// into charts of comparable numbers.
pub fn unit_of(key: &str) -> &'static str {
    const UNITS: &[(&str, &str)] = &[
        ("mpps", "Mpps"),
        ("pps", "packets/s"),
        ("gbps", "Gbit/s"),
        ("mbps", "Mbit/s"),
        ("mbit", "Mbit/s"),
        ("ns", "ns"),
        ("us", "µs"),
        ("ms", "ms"),
        ("pct", "%"),
        ("bytes", "bytes"),
        ("kb", "KB"),
    ];
    let words: Vec<&str> = key.split('_').collect();
    if key.contains("ops_per_sec") || key.contains("ops_per_cpu") {
        return "operations/s";
    }
    for (word, unit) in UNITS {
        if words.contains(word) {
            return unit;
        }
    }
    "counts and other"
}

/// How many rows one chart has at most; a larger group is split.
const MAX_ROWS: usize = 40;

struct Section<'a> {
    name: &'a str,
    runs: Vec<&'a Run>,
}

/// The report page for `loaded`.
pub fn render(loaded: &Loaded) -> Result<String, ReportError> {
    let mut by_name: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &loaded.runs {
        by_name.entry(run.name.as_str()).or_default().push(run);
    }
    let mut sections: Vec<Section<'_>> = Vec::new();
    for b in crate::BENCHES {
        if let Some(runs) = by_name.remove(b.name) {
            sections.push(Section { name: b.name, runs });
        }
    }
    // Names this build does not know (another version's benches), alphabetically.
    for (name, runs) in by_name {
        sections.push(Section { name, runs });
    }

    let mut h = String::new();
    let title = format!("flowstate benchmarks — {}", loaded.dir.display());
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    let _ = writeln!(
        h,
        "<p class=\"summary\">{} benches from {} result files. Claims are ratios measured in one \
         run against a baseline beside it (BENCHMARKS.md); absolute figures are for orientation. \
         Bars are the median over a bench's files, whiskers the smallest and largest; orange \
         bars are the number the paper reports for the same quantity. Plots use a log scale.</p>",
        sections.len(),
        loaded.runs.len()
    );
    if !loaded.skipped.is_empty() {
        h.push_str("<div class=\"skipped\"><h2>Skipped files</h2><ul>\n");
        for (file, reason) in &loaded.skipped {
            let _ = writeln!(
                h,
                "<li><code>{}</code>: {}</li>",
                esc(&file.display().to_string()),
                esc(reason)
            );
        }
        h.push_str("</ul></div>\n");
    }
    h.push_str("<nav><ul>\n");
    for s in &sections {
        let _ = writeln!(
            h,
            "<li><a href=\"#bench-{0}\">{1}</a></li>",
            anchor(s.name),
            esc(s.name)
        );
    }
    h.push_str("</ul></nav>\n");
    for s in &sections {
        section(&mut h, s)?;
    }
    h.push_str("</body>\n</html>\n");
    Ok(h)
}

fn anchor(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn section(h: &mut String, s: &Section<'_>) -> Result<(), ReportError> {
    let bench = crate::find(s.name);
    let figure = crate::paper::figure(s.name);
    let runs = s.runs.len();
    let ratios = stats(&s.runs, |r| &r.ratios);
    let metrics = stats(&s.runs, |r| &r.metrics);
    let paper = |key: &str| -> Option<&'static crate::paper::Reference> {
        figure.and_then(|f| f.refs.iter().find(|r| r.key == key))
    };

    let _ = writeln!(
        h,
        "<section class=\"bench\" id=\"bench-{}\" data-bench=\"{}\" data-runs=\"{runs}\">",
        anchor(s.name),
        esc(s.name)
    );
    let _ = writeln!(h, "<h2>{}</h2>", esc(s.name));
    match bench {
        Some(b) => {
            let _ = writeln!(h, "<p class=\"about\">{}</p>", esc(b.about));
        }
        None => {
            h.push_str(
                "<p class=\"about\">A bench this build of flowstate does not know: its numbers \
                 as written, no paper figure.</p>\n",
            );
        }
    }
    if let Some(f) = figure {
        let _ = writeln!(
            h,
            "<p class=\"figure\">Reproduces <b>{}</b>: {}.</p>",
            esc(f.figure),
            esc(f.shows)
        );
    }
    let files: Vec<String> = s
        .runs
        .iter()
        .map(|r| {
            r.file.file_name().map_or_else(
                || r.file.display().to_string(),
                |f| f.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let _ = writeln!(
        h,
        "<p class=\"runs\">{runs} run{}: {}</p>",
        if runs == 1 { "" } else { "s" },
        files
            .iter()
            .map(|f| format!("<code>{}</code>", esc(f)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The charts: ratios first, then metrics by unit.
    let bars = |m: &BTreeMap<&str, Option<Stat>>, prefix: &str, filter: &dyn Fn(&str) -> bool| {
        m.iter()
            .filter(|(k, _)| filter(k))
            .map(|(k, st)| Bar {
                key: (*k).to_owned(),
                measured: *st,
                paper: paper(&format!("{prefix}.{k}")).map(|r| r.value),
            })
            .collect::<Vec<_>>()
    };
    let mut charts: Vec<(String, &str, Vec<Bar>)> = Vec::new();
    let ratio_bars = bars(&ratios, "ratios", &|_| true);
    for (i, chunk) in ratio_bars.chunks(MAX_ROWS).enumerate() {
        let part = if ratio_bars.len() > MAX_ROWS {
            format!(" ({}/{})", i + 1, ratio_bars.len().div_ceil(MAX_ROWS))
        } else {
            String::new()
        };
        charts.push((
            format!("{}: ratios{part} (1 = parity)", s.name),
            "ratios",
            chunk.to_vec(),
        ));
    }
    let mut units: Vec<&str> = metrics.keys().map(|k| unit_of(k)).collect();
    units.sort_by_key(|u| (*u == "counts and other", *u));
    units.dedup();
    for unit in units {
        let group = bars(&metrics, "metrics", &|k| unit_of(k) == unit);
        for (i, chunk) in group.chunks(MAX_ROWS).enumerate() {
            let part = if group.len() > MAX_ROWS {
                format!(" ({}/{})", i + 1, group.len().div_ceil(MAX_ROWS))
            } else {
                String::new()
            };
            charts.push((
                format!("{}: metrics in {unit}{part}", s.name),
                "metrics",
                chunk.to_vec(),
            ));
        }
    }

    // The first chart beside the paper's numbers and the machine.
    h.push_str("<div class=\"pair\">\n");
    let mut rest = charts.into_iter();
    if let Some((title, kind, bars)) = rest.next() {
        figure_html(h, &title, kind, &bars, runs)?;
    } else {
        h.push_str("<p class=\"empty\">This result has no numbers to plot.</p>\n");
    }
    h.push_str("<aside>\n");
    reference_table(h, figure, &ratios, &metrics);
    machine_table(h, &s.runs);
    h.push_str("</aside>\n</div>\n");
    let more: Vec<_> = rest.collect();
    if !more.is_empty() {
        h.push_str("<div class=\"more\">\n");
        for (title, kind, bars) in more {
            figure_html(h, &title, kind, &bars, runs)?;
        }
        h.push_str("</div>\n");
    }
    numbers_table(h, "All ratios", &ratios);
    numbers_table(h, "All metrics", &metrics);
    params_table(h, &s.runs);
    h.push_str("</section>\n");
    Ok(())
}

fn figure_html(
    h: &mut String,
    title: &str,
    kind: &str,
    bars: &[Bar],
    runs: usize,
) -> Result<(), ReportError> {
    let svg = bar_chart(title, bars, runs)?;
    let _ = writeln!(
        h,
        "<figure class=\"plot\" data-kind=\"{kind}\" title=\"{}\">\n{}\n</figure>",
        esc(title),
        svg.trim()
    );
    Ok(())
}

fn reference_table(
    h: &mut String,
    figure: Option<&crate::paper::Figure>,
    ratios: &BTreeMap<&str, Option<Stat>>,
    metrics: &BTreeMap<&str, Option<Stat>>,
) {
    h.push_str("<h3>The paper's numbers</h3>\n");
    let Some(f) = figure.filter(|f| !f.refs.is_empty()) else {
        h.push_str(
            "<p class=\"noref\">No number from a paper for this bench: it compares against a \
             baseline measured in the same run.</p>\n",
        );
        return;
    };
    h.push_str(
        "<table class=\"paper\"><tr><th>key</th><th>paper</th><th>measured</th><th>source</th></tr>\n",
    );
    for r in f.refs {
        let measured = r
            .key
            .strip_prefix("ratios.")
            .and_then(|k| ratios.get(k))
            .or_else(|| r.key.strip_prefix("metrics.").and_then(|k| metrics.get(k)));
        let measured = match measured {
            Some(Some(s)) => stat_text(s),
            Some(None) => "—".to_owned(),
            None => "not in these runs".to_owned(),
        };
        let _ = writeln!(
            h,
            "<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(r.key),
            fmt_num(r.value),
            esc(&measured),
            esc(r.source)
        );
    }
    h.push_str("</table>\n");
}

fn machine_table(h: &mut String, runs: &[&Run]) {
    // Distinct machines, with how many runs each.
    let mut machines: Vec<(&BTreeMap<String, Value>, usize)> = Vec::new();
    for r in runs {
        match machines.iter_mut().find(|(m, _)| *m == &r.machine) {
            Some((_, n)) => *n += 1,
            None => machines.push((&r.machine, 1)),
        }
    }
    h.push_str("<h3>Machine</h3>\n");
    for (m, n) in machines {
        if m.is_empty() {
            let _ = writeln!(h, "<p class=\"machine\">not recorded ({n} run(s))</p>");
            continue;
        }
        let _ = writeln!(h, "<table class=\"machine\" data-runs=\"{n}\">");
        if runs.len() > 1 {
            let _ = writeln!(
                h,
                "<tr><th colspan=\"2\">{n} of {} runs</th></tr>",
                runs.len()
            );
        }
        for (k, v) in m {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = writeln!(h, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(&v));
        }
        h.push_str("</table>\n");
    }
}

fn numbers_table(h: &mut String, title: &str, m: &BTreeMap<&str, Option<Stat>>) {
    if m.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<details><summary>{} ({})</summary>\n<table class=\"numbers\">\
         <tr><th>key</th><th>median</th><th>min</th><th>max</th><th>runs</th></tr>",
        esc(title),
        m.len()
    );
    for (k, s) in m {
        match s {
            Some(s) => {
                let _ = writeln!(
                    h,
                    "<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                     <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                    esc(k),
                    fmt_num(s.median),
                    fmt_num(s.min),
                    fmt_num(s.max),
                    s.n
                );
            }
            None => {
                let _ = writeln!(
                    h,
                    "<tr><td><code>{}</code></td><td colspan=\"4\">not a finite number</td></tr>",
                    esc(k)
                );
            }
        }
    }
    h.push_str("</table></details>\n");
}

fn params_table(h: &mut String, runs: &[&Run]) {
    let mut keys: Vec<&str> = runs
        .iter()
        .flat_map(|r| r.params.keys().map(String::as_str))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<details><summary>Parameters</summary>\n<table class=\"params\">"
    );
    for k in keys {
        let mut values: Vec<String> = runs
            .iter()
            .filter_map(|r| r.params.get(k))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        values.dedup();
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(k),
            esc(&values.join(" | "))
        );
    }
    h.push_str("</table></details>\n");
}

const STYLE: &str = "
body{font-family:sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:19px;margin-top:0}h3{font-size:15px;margin:10px 0 6px}
section.bench{border-top:2px solid #ccc;padding-top:14px;margin-top:28px}
.pair{display:flex;flex-wrap:wrap;gap:20px;align-items:flex-start}
.pair aside{flex:1;min-width:320px;max-width:620px}
.more{display:flex;flex-wrap:wrap;gap:20px}
figure{margin:0}figure svg{border:1px solid #ddd;max-width:100%;height:auto}
table{border-collapse:collapse;font-size:13px;margin-bottom:8px}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.skipped{background:#fff4e0;border:1px solid #e8a33c;padding:4px 12px}
nav ul{display:flex;flex-wrap:wrap;gap:4px 16px;list-style:none;padding:0}
p.about{color:#444}p.runs{font-size:13px;color:#555}
details{margin:6px 0}
";

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    fn result(name: &str, ratio: f64) -> String {
        format!(
            r#"{{"name":"{name}","params":{{"quick":true}},"metrics":{{"a_ns_ipv4":{ratio},"lost":0,"nan_one":null}},
               "ratios":{{"crc32c_hw_vs_bytewise":{ratio}}},"machine":{{"cpu":"Test CPU","cores":2}}}}"#
        )
    }

    #[test]
    fn median_and_spread_of_repeated_runs() {
        let s = Stat::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Stat::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Stat::of(&[]).is_none());
        assert!(Stat::of(&[f64::NAN]).is_none());
    }

    #[test]
    fn numbers_read_as_a_person_writes_them() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(4.1234), "4.12");
        assert_eq!(fmt_num(0.5300), "0.53");
        assert_eq!(fmt_num(17557.6), "17,558");
        assert_eq!(fmt_num(1234567.0), "1,234,567");
        assert_eq!(fmt_num(-0.009), "-0.009");
        assert_eq!(fmt_num(250.4), "250");
        assert_eq!(fmt_num(f64::NAN), "—");
    }

    #[test]
    fn units_group_metrics() {
        assert_eq!(unit_of("nat_mpps_per_core_1m_flows"), "Mpps");
        assert_eq!(unit_of("crc32c_hw_ns_ipv4"), "ns");
        assert_eq!(unit_of("overhead_us_p50_t"), "µs");
        assert_eq!(unit_of("store_ops_per_sec_depth64"), "operations/s");
        assert_eq!(unit_of("throughput_spread_pct"), "%");
        assert_eq!(unit_of("flows_broken_on_scale_out"), "counts and other");
    }

    #[test]
    fn malformed_files_say_what_is_wrong() {
        let p = Path::new("x.json");
        assert!(parse_run(p, "{").unwrap_err().starts_with("not JSON"));
        assert!(parse_run(p, "[1]").unwrap_err().contains("not an object"));
        assert!(parse_run(p, r#"{"metrics":{}}"#)
            .unwrap_err()
            .contains("no `name`"));
        assert!(parse_run(p, r#"{"name":"x"}"#)
            .unwrap_err()
            .contains("neither"));
        let e = parse_run(p, r#"{"name":"x","metrics":{"a":"fast"}}"#).unwrap_err();
        assert!(
            e.contains("`metrics.a`") && e.contains("not a number"),
            "{e}"
        );
        let run = parse_run(p, &result("hashing", 4.0)).unwrap();
        assert_eq!(run.ratios["crc32c_hw_vs_bytewise"], Some(4.0));
        assert_eq!(run.metrics["nan_one"], None);
        assert_eq!(run.machine["cpu"], "Test CPU");
    }

    #[test]
    fn directory_errors_name_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = load_dir(&missing).unwrap_err();
        assert!(matches!(e, ReportError::Dir { .. }));
        assert!(e.to_string().contains("nope"), "{e}");

        let e = load_dir(dir.path()).unwrap_err();
        assert!(matches!(e, ReportError::NoJson { .. }), "{e}");
        write(dir.path(), "notes.txt", "not json");
        assert!(matches!(
            load_dir(dir.path()).unwrap_err(),
            ReportError::NoJson { .. }
        ));

        write(dir.path(), "broken.json", "{\"name\": \"hashing\", ");
        let e = load_dir(dir.path()).unwrap_err();
        assert!(matches!(e, ReportError::NoneValid { count: 1, .. }), "{e}");
        assert!(e.to_string().contains("broken.json"), "{e}");
    }

    #[test]
    fn malformed_files_are_skipped_and_named_on_the_page() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "hashing-1.json", &result("hashing", 4.0));
        write(dir.path(), "hashing-2.json", &result("hashing", 5.0));
        write(dir.path(), "hashing-3.json", &result("hashing", 9.0));
        write(dir.path(), "truncated.json", "{\"name\": \"chc\", \"metr");
        write(
            dir.path(),
            "someone-elses.json",
            &result("not-a-flowstate-bench", 2.0),
        );
        let loaded = load_dir(dir.path()).unwrap();
        assert_eq!(loaded.runs.len(), 4);
        assert_eq!(loaded.skipped.len(), 1);
        assert!(loaded.skipped[0].0.ends_with("truncated.json"));

        let page = render(&loaded).unwrap();
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("truncated.json"), "skipped file named");
        // One section per bench; the known one first, the unknown one generic.
        assert_eq!(page.matches("<section class=\"bench\"").count(), 2);
        let known = page.find("data-bench=\"hashing\"").unwrap();
        let unknown = page.find("data-bench=\"not-a-flowstate-bench\"").unwrap();
        assert!(known < unknown);
        assert!(page.contains("does not know"));
        // Three runs of one bench: median 5 [4–9], beside the paper's 5.
        assert!(page.contains("data-runs=\"3\""));
        assert!(page.contains("5 [4–9]"), "median with spread");
        assert!(page.contains("HashMVT §VI-C"));
        assert!(page.contains("median of 3 runs"));
        // Every section has an inline SVG plot, and nothing outside the page is referenced.
        for part in page.split("<section").skip(1) {
            assert!(part.contains("<svg"), "a section without a plot");
        }
        assert!(!page.contains("src=") && !page.contains("<link") && !page.contains("<script"));
        assert!(page.contains("Test CPU"));
    }

    #[test]
    fn the_chart_is_svg_with_text_and_the_paper_series() {
        let bars = vec![
            Bar {
                key: "lazy_vs_busy_latency_10_tables".into(),
                measured: Stat::of(&[0.27, 0.26, 0.3]),
                paper: Some(0.53),
            },
            Bar {
                key: "offset_<&>".into(),
                measured: Stat::of(&[-0.01]),
                paper: None,
            },
            Bar {
                key: "nothing".into(),
                measured: None,
                paper: None,
            },
        ];
        let svg = bar_chart("t", &bars, 3).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("<text"), "labels are SVG text, no font files");
        assert!(svg.contains("lazy_vs_busy_latency_10_tables"));
        assert!(svg.contains("offset_&lt;&amp;&gt;"), "text escaped");
        assert!(svg.contains("paper 0.53"));
        assert!(svg.contains("0.27 [0.26–0.3]"));
        assert!(
            svg.contains("-0.01"),
            "a negative value is written, not drawn"
        );
        // Both series' colours are drawn.
        assert!(
            svg.contains("#3465A4") || svg.contains("#3465a4"),
            "measured bars"
        );
        assert!(
            svg.contains("#E68C1E") || svg.contains("#e68c1e"),
            "paper bars"
        );
        // An empty chart still draws.
        assert!(bar_chart("empty", &[], 1).unwrap().contains("<svg"));
    }
}
