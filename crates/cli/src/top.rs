//! `flowstate top ADDR`: a live terminal view of a running box (or store), read every second
//! from its telemetry listener (`--metrics ADDR`): `/api/v1/info` says what the process is and
//! which document holds its numbers, then that document is polled.
//!
//! Promises:
//! * Rates are a counter's change between two readings divided by the time between them on
//!   the process's own clock (`wall_s`, `uptime_s`) when the document has one, else on ours; a
//!   counter that went back (the process restarted) shows `-` for one reading.
//! * The NFs and their report entries are what the document lists: no NF's name is known
//!   here.
//! * `q`, Esc and Ctrl-C quit; so do SIGINT and SIGTERM. The terminal is restored however the
//!   view ends (a panic included).
//! * A process that goes away is shown as "disconnected, retrying" with its last numbers; the
//!   view reconnects when it is back.

use anyhow::{bail, Context, Result};
use clap::Args;
use flowstate_telemetry::{client, Token};
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Options of `flowstate top`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  ip netns exec fs-nf flowstate run examples/live-nat.toml --metrics 127.0.0.1:9464 &\n  \
ip netns exec fs-nf flowstate top 127.0.0.1:9464   (the box's namespace: its loopback)\n\nKeys: q, Esc or Ctrl-C quit. The same numbers, charted, are on \
http://ADDR/ (the dashboard)."
)]
pub(crate) struct TopArgs {
    /// The telemetry listener of a running box or store (its `--metrics ADDR` or
    /// `[telemetry] listen`): `HOST:PORT`, `http://HOST:PORT/`, or a port alone for loopback.
    addr: String,
    /// Time between readings ("1s", "500ms"; 100ms to 1h).
    #[arg(long, default_value = "1s", value_parser = interval)]
    interval: Duration,
    /// Print one view as plain text (two readings one interval apart, for the rates) and exit.
    #[arg(long)]
    pub(crate) once: bool,
    /// Present the token in FILE to the listener (its `[telemetry] token_file`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
}

fn interval(s: &str) -> Result<Duration, String> {
    let d = flowstate_config::parse_duration(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("expected 100ms to 1h, got {s:?}"));
    }
    Ok(d)
}

/// The listener's address from what a user types: `HOST:PORT`, `http://HOST:PORT/...`, or a
/// port alone (loopback).
fn resolve(addr: &str) -> Result<SocketAddr> {
    let t = addr.trim();
    let t = t.strip_prefix("http://").unwrap_or(t);
    let t = t.split('/').next().unwrap_or(t);
    if let Ok(a) = flowstate_telemetry::parse_listen(t) {
        return Ok(a);
    }
    t.to_socket_addrs()
        .with_context(|| format!("{addr:?}: expected HOST:PORT or a port"))?
        .next()
        .with_context(|| format!("{addr:?}: no address"))
}

/// Runs the view until a quit key or signal.
pub(crate) fn run(a: &TopArgs) -> Result<()> {
    let addr = resolve(&a.addr)?;
    let token = a
        .token_file
        .as_deref()
        .map(|f| crate::telemetry::read_token(f, "--token-file"))
        .transpose()?;
    if a.once {
        return once(addr, a.interval, token);
    }
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        bail!("the view needs a terminal; `flowstate top --once ADDR` prints one view as text");
    }
    if let Err(e) = flowstate_router::Stop::on_signals() {
        tracing::warn!("cannot catch SIGINT/SIGTERM: {e}");
    }
    let readings = spawn_reader(addr, a.interval, token);
    // ratatui's init: raw mode, the alternate screen, and a panic hook that restores both.
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    let result = ui(&mut terminal, addr, a.interval, &readings);
    let _ = terminal.show_cursor();
    ratatui::restore();
    result
}

/// One reading of the process's document (or why there is none).
type Polled = std::result::Result<(String, Value), String>;

/// Reads the document every `every` on a thread of its own (the screen answers keys while a
/// reading waits); the thread ends once the receiver is gone.
fn spawn_reader(
    addr: SocketAddr,
    every: Duration,
    token: Option<Token>,
) -> mpsc::Receiver<(Instant, Polled)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut source = Source::new(addr, every.max(Duration::from_secs(2)), token);
        loop {
            let started = Instant::now();
            let got = source.read();
            if tx.send((Instant::now(), got)).is_err() {
                return;
            }
            std::thread::sleep(every.saturating_sub(started.elapsed()));
        }
    });
    rx
}

/// The process's listener: what it is (asked again after every failure) and its document.
struct Source {
    addr: SocketAddr,
    timeout: Duration,
    /// Role and document path, once `/api/v1/info` answered.
    info: Option<(String, String)>,
    /// What the listener wants in `Authorization: Bearer`, if anything.
    token: Option<Token>,
}

impl Source {
    fn new(addr: SocketAddr, timeout: Duration, token: Option<Token>) -> Self {
        Source {
            addr,
            timeout,
            info: None,
            token,
        }
    }

    fn get(&self, path: &str) -> std::result::Result<Value, String> {
        let r = client::get_with(self.addr, path, self.timeout, self.token.as_ref())
            .map_err(|e| e.to_string())?;
        if r.status == 401 {
            return Err(format!(
                "{path}: HTTP 401: the listener wants its token: give --token-file FILE"
            ));
        }
        if r.status != 200 {
            return Err(format!("{path}: HTTP {}", r.status));
        }
        serde_json::from_slice(&r.body).map_err(|e| format!("{path}: not JSON: {e}"))
    }

    fn read(&mut self) -> Polled {
        if self.info.is_none() {
            let (role, doc) = match self.get("/api/v1/info") {
                Ok(v) => (
                    v["role"].as_str().unwrap_or("").to_owned(),
                    v["document"].as_str().unwrap_or("summary").to_owned(),
                ),
                // A listener from before /api/v1/info.
                Err(e) if e.ends_with("HTTP 404") => (String::new(), "summary".to_owned()),
                Err(e) => return Err(e),
            };
            if !doc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("/api/v1/info names a strange document {doc:?}"));
            }
            self.info = Some((role, format!("/api/v1/{doc}")));
        }
        let (role, path) = self.info.clone().unwrap_or_default();
        match self.get(&path) {
            Ok(doc) => Ok((role, doc)),
            Err(e) => {
                self.info = None;
                Err(e)
            }
        }
    }
}

/// `--once`: two readings one interval apart, printed as text.
fn once(addr: SocketAddr, every: Duration, token: Option<Token>) -> Result<()> {
    let mut source = Source::new(addr, every.max(Duration::from_secs(2)), token);
    let read = |s: &mut Source| {
        s.read()
            .map_err(|e| anyhow::anyhow!("{addr}: {e}"))
            .map(|r| (Instant::now(), r))
    };
    let (t0, (_, first)) = read(&mut source)?;
    std::thread::sleep(every);
    let (t1, (role, second)) = read(&mut source)?;
    let (_, prev) = View::build(&role, &first, None);
    let (view, _) = View::build(&role, &second, Some((&prev, t1 - t0)));
    print!("{}", view.text());
    Ok(())
}

// ---- the view: numbers from readings ----------------------------------------------------------

/// The counters of the previous reading, by key, and its clock.
#[derive(Debug, Clone, Default)]
struct Previous {
    clock: Option<f64>,
    counters: HashMap<String, f64>,
    /// The report entries shown so far: an entry shows once it is not zero, and stays.
    shown: HashSet<String>,
}

/// Rates against the previous reading.
struct Rates<'a> {
    prev: Option<&'a Previous>,
    dt: Option<f64>,
    now: Previous,
}

impl Rates<'_> {
    /// The counter `key`'s rate since the previous reading (`None`: no previous reading, no
    /// time passed, or it went back).
    fn rate(&mut self, key: &str, v: Option<f64>) -> Option<f64> {
        let v = v?;
        self.now.counters.insert(key.to_owned(), v);
        let before = *self.prev?.counters.get(key)?;
        let dt = self.dt?;
        (v >= before).then(|| (v - before) / dt)
    }

    /// Whether to show the entry `key` of value `v`: once it has not been zero.
    fn show(&mut self, key: String, v: Option<f64>) -> bool {
        let shown = v != Some(0.0) || self.prev.is_some_and(|p| p.shown.contains(&key));
        if shown {
            self.now.shown.insert(key);
        }
        shown
    }
}

/// A table of the view.
#[derive(Debug, Clone, PartialEq)]
struct Table {
    title: String,
    header: Vec<&'static str>,
    /// How many leading columns are text (left-aligned); the others are numbers.
    text: usize,
    rows: Vec<Vec<String>>,
    /// Shown beside the others when the terminal is wide enough.
    side: bool,
}

/// What the screen shows.
#[derive(Debug, Clone, PartialEq)]
struct View {
    /// What the process is (`chain · state local · 2 workers · up 12.0 s`).
    title: String,
    /// The main numbers, `(name, value)`.
    headline: Vec<(String, String)>,
    /// The headline rate (packets in, or store operations, a second), for the sparkline.
    rate: Option<f64>,
    tables: Vec<Table>,
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

fn obj(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

/// A rate for a person: `-` unknown, `12.5`, `1234`, `45.6k`, `1.23M`.
fn fmt_rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r >= 1e9 => format!("{:.2}G", r / 1e9),
        Some(r) if r >= 1e6 => format!("{:.2}M", r / 1e6),
        Some(r) if r >= 1e4 => format!("{:.1}k", r / 1e3),
        Some(r) if r >= 100.0 => format!("{r:.0}"),
        Some(r) => format!("{r:.1}"),
    }
}

/// A count as it is (integers without a fraction).
fn fmt_num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{}", v as i64),
        Some(v) => format!("{v:.3}"),
    }
}

impl View {
    /// The view of `doc` (the reading of a process whose role is `role`); `prev` is the
    /// previous reading's counters and the time since it on our clock. Also the counters to
    /// pass as `prev` next time.
    fn build(role: &str, doc: &Value, prev: Option<(&Previous, Duration)>) -> (View, Previous) {
        let clock = num(&doc["wall_s"]).or_else(|| num(&doc["uptime_s"]));
        let dt = prev.and_then(|(p, ours)| match (p.clock, clock) {
            (Some(a), Some(b)) => (b > a).then_some(b - a),
            _ => Some(ours.as_secs_f64()).filter(|d| *d > 0.0),
        });
        let mut rates = Rates {
            prev: prev.map(|(p, _)| p),
            dt,
            now: Previous {
                clock,
                ..Previous::default()
            },
        };
        let mut view = if doc["nfs"].is_array() {
            chain(doc, &mut rates)
        } else if doc["ops"].is_object() {
            store(doc, &mut rates)
        } else {
            generic(doc)
        };
        view.title = [role, &view.title]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" · ");
        (view, rates.now)
    }

    /// The view as plain text (`--once`).
    fn text(&self) -> String {
        let mut out = format!("{}\n", self.title);
        let line: Vec<String> = self
            .headline
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        out.push_str(&line.join("  "));
        out.push('\n');
        for t in &self.tables {
            out.push_str(&format!("\n{}\n", t.title));
            let mut widths: Vec<usize> = t.header.iter().map(|h| h.chars().count()).collect();
            for r in &t.rows {
                for (i, c) in r.iter().enumerate() {
                    if let Some(w) = widths.get_mut(i) {
                        *w = (*w).max(c.chars().count());
                    }
                }
            }
            let fmt_row = |cells: Vec<&str>| {
                let mut s = String::new();
                for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                    if i == 0 {
                        s.push_str(&format!("{c:<w$}"));
                    } else {
                        s.push_str(&format!("  {c:>w$}"));
                    }
                }
                s.trim_end().to_owned() + "\n"
            };
            out.push_str(&fmt_row(t.header.clone()));
            for r in &t.rows {
                out.push_str(&fmt_row(r.iter().map(String::as_str).collect()));
            }
        }
        out
    }
}

/// A run of the chain: its summary.
fn chain(d: &Value, r: &mut Rates<'_>) -> View {
    let workers: Vec<&Value> = d["per_worker"].as_array().into_iter().flatten().collect();
    let sum = |key: &str| -> Option<f64> {
        workers
            .iter()
            .map(|w| num(&w[key]))
            .try_fold(0.0, |a, v| v.map(|v| a + v))
    };
    let rate_in = r.rate("in", num(&d["packets_in"]));
    let rate_out = r.rate("out", num(&d["packets_out"]));
    let rate_drop = r.rate("dropped", num(&d["dropped_total"]));
    let errors = sum("state_errors");
    let headline = vec![
        ("in/s".into(), fmt_rate(rate_in)),
        ("out/s".into(), fmt_rate(rate_out)),
        ("dropped/s".into(), fmt_rate(rate_drop)),
        ("in".into(), fmt_num(num(&d["packets_in"]))),
        ("out".into(), fmt_num(num(&d["packets_out"]))),
        ("dropped".into(), fmt_num(num(&d["dropped_total"]))),
        ("flush errors".into(), fmt_num(errors)),
    ];

    let nfs: Vec<(&str, &Value)> = d["nfs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|nf| Some((nf["name"].as_str()?, nf)))
        .collect();
    let mut nf_rows = Vec::new();
    let mut drop_rows = Vec::new();
    let mut report_rows = Vec::new();
    for (name, nf) in &nfs {
        let dropped: Option<f64> = obj(&nf["dropped"])
            .map(|(_, v)| num(v))
            .try_fold(0.0, |a, v| v.map(|v| a + v));
        nf_rows.push(vec![
            (*name).to_owned(),
            fmt_rate(r.rate(&format!("nf/{name}"), num(&nf["packets_in"]))),
            fmt_rate(r.rate(&format!("fwd/{name}"), num(&nf["forwarded"]))),
            fmt_rate(r.rate(&format!("drop/{name}"), dropped)),
            fmt_num(num(&nf["packets_in"])),
            fmt_num(dropped),
        ]);
        for (reason, n) in obj(&nf["dropped"]) {
            drop_rows.push(vec![
                (*name).to_owned(),
                reason.to_owned(),
                fmt_rate(r.rate(&format!("drop/{name}/{reason}"), num(n))),
                fmt_num(num(n)),
            ]);
        }
        for (key, v) in obj(&nf["report"]) {
            if r.show(format!("{name}/{key}"), num(v)) {
                report_rows.push(vec![(*name).to_owned(), key.clone(), fmt_num(num(v))]);
            }
        }
    }
    for (reason, n) in obj(&d["malformed"]) {
        drop_rows.push(vec![
            "(malformed)".into(),
            reason.clone(),
            fmt_rate(r.rate(&format!("malformed/{reason}"), num(n))),
            fmt_num(num(n)),
        ]);
    }
    let mut worker_rows = Vec::new();
    for w in &workers {
        let i = w["index"].as_u64().map_or("?".into(), |i| i.to_string());
        let busy = r.rate(&format!("busy/{i}"), num(&w["busy_s"]));
        worker_rows.push(vec![
            i.clone(),
            fmt_rate(r.rate(&format!("worker/{i}"), num(&w["packets"]))),
            busy.map_or("-".into(), |b| format!("{:.0}%", (b * 100.0).min(100.0))),
            fmt_rate(r.rate(&format!("flushes/{i}"), num(&w["state_flushes"]))),
            fmt_num(num(&w["state_errors"])),
            fmt_num(num(&w["state_lost_ops"])),
        ]);
    }
    let mut tables = vec![
        Table {
            title: "NFs (packets)".into(),
            header: vec!["nf", "in/s", "fwd/s", "drop/s", "in", "dropped"],
            text: 1,
            rows: nf_rows,
            side: false,
        },
        Table {
            title: "Drops by reason".into(),
            header: vec!["nf", "reason", "/s", "total"],
            text: 2,
            rows: drop_rows,
            side: false,
        },
        Table {
            title: "Workers and state".into(),
            header: vec![
                "worker",
                "pkts/s",
                "busy",
                "flush/s",
                "flush err",
                "lost ops",
            ],
            text: 1,
            rows: worker_rows,
            side: false,
        },
    ];
    let ports: Vec<Vec<String>> = obj(&d["live_box"])
        .filter_map(|(k, v)| {
            let port = k.strip_suffix("_packets")?;
            Some(vec![
                port.to_owned(),
                fmt_rate(r.rate(&format!("box/{k}"), num(v))),
                fmt_num(num(v)),
            ])
        })
        .collect();
    if !ports.is_empty() {
        tables.push(Table {
            title: "Box ports (frames)".into(),
            header: vec!["port", "/s", "total"],
            text: 1,
            rows: ports,
            side: false,
        });
    }
    tables.push(Table {
        title: "NF reports (tables' fill, counters; not while zero)".into(),
        header: vec!["nf", "entry", "value"],
        text: 2,
        rows: report_rows,
        side: true,
    });
    let mut title = Vec::new();
    if let Some(b) = d["backend"].as_str() {
        title.push(format!("state {b}"));
    }
    if let Some(w) = d["workers"].as_u64() {
        title.push(format!("{w} worker(s)"));
    }
    if let Some(s) = num(&d["wall_s"]) {
        title.push(format!("up {s:.1} s"));
    }
    View {
        title: title.join(" · "),
        headline,
        rate: rate_in,
        tables,
    }
}

/// The store: its statistics.
fn store(d: &Value, r: &mut Rates<'_>) -> View {
    let mut rows = Vec::new();
    let mut total = Some(0.0);
    for (op, n) in obj(&d["ops"]) {
        total = total.zip(num(n)).map(|(a, b)| a + b);
        let rate = r.rate(&format!("op/{op}"), num(n));
        // Only the operations the store has applied (clients use a few of the types).
        if num(n) == Some(0.0) {
            continue;
        }
        rows.push(vec![op.clone(), fmt_rate(rate), fmt_num(num(n))]);
    }
    let rate = r.rate("ops", total);
    rows.push(vec!["all".into(), fmt_rate(rate), fmt_num(total)]);
    let headline = vec![
        ("ops/s".into(), fmt_rate(rate)),
        ("ops".into(), fmt_num(total)),
        ("connections".into(), fmt_num(num(&d["connections"]))),
        ("objects".into(), fmt_num(num(&d["objects"]))),
        ("errors".into(), fmt_num(num(&d["errors"]))),
    ];
    let mut title = Vec::new();
    if let Some(s) = d["shards"].as_u64() {
        title.push(format!("{s} shard(s)"));
    }
    if let Some(s) = num(&d["uptime_s"]) {
        title.push(format!("up {s:.1} s"));
    }
    let mut view = generic(d);
    view.tables[0].side = true;
    view.tables.insert(
        0,
        Table {
            title: "Operations by type".into(),
            header: vec!["op", "/s", "total"],
            text: 1,
            rows,
            side: false,
        },
    );
    View {
        title: title.join(" · "),
        headline,
        rate,
        tables: view.tables,
    }
}

/// Any document: its top-level numbers.
fn generic(d: &Value) -> View {
    let rows = obj(d)
        .filter_map(|(k, v)| Some(vec![k.clone(), fmt_num(Some(num(v)?))]))
        .collect();
    View {
        title: String::new(),
        headline: Vec::new(),
        rate: None,
        tables: vec![Table {
            title: "Numbers".into(),
            header: vec!["name", "value"],
            text: 1,
            rows,
            side: false,
        }],
    }
}

// ---- the screen -------------------------------------------------------------------------------

/// What the screen knows between readings.
struct App {
    addr: SocketAddr,
    interval: Duration,
    view: Option<View>,
    prev: Option<(Previous, Instant)>,
    /// When the last good reading came.
    last_ok: Option<Instant>,
    /// Why the last reading failed (`None`: it did not).
    error: Option<String>,
    /// The headline rate's recent values, for the sparkline.
    history: VecDeque<u64>,
}

impl App {
    fn take(&mut self, at: Instant, polled: Polled) {
        match polled {
            Ok((role, doc)) => {
                let prev = self
                    .prev
                    .as_ref()
                    .map(|(p, t)| (p, at.saturating_duration_since(*t)));
                let (view, now) = View::build(&role, &doc, prev);
                if let Some(r) = view.rate {
                    self.history.push_back(r.round() as u64);
                    while self.history.len() > 240 {
                        self.history.pop_front();
                    }
                }
                self.view = Some(view);
                self.prev = Some((now, at));
                self.last_ok = Some(at);
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }
}

fn ui(
    terminal: &mut ratatui::DefaultTerminal,
    addr: SocketAddr,
    interval: Duration,
    readings: &mpsc::Receiver<(Instant, Polled)>,
) -> Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    let stop = flowstate_router::Stop::new();
    let mut app = App {
        addr,
        interval,
        view: None,
        prev: None,
        last_ok: None,
        error: None,
        history: VecDeque::new(),
    };
    loop {
        while let Ok((at, polled)) = readings.try_recv() {
            app.take(at, polled);
        }
        terminal.draw(|f| draw(f, &app))?;
        if stop.stopped() {
            return Ok(());
        }
        if event::poll(Duration::from_millis(200))? {
            if let Event::Key(k) = event::read()? {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                if k.kind != KeyEventKind::Release
                    && (ctrl_c
                        || matches!(
                            k.code,
                            KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc
                        ))
                {
                    return Ok(());
                }
            }
        }
    }
}

fn draw(f: &mut ratatui::Frame, app: &App) {
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Color, Modifier, Style};
    use ratatui::text::{Line, Span};
    use ratatui::widgets::{Paragraph, Sparkline, Wrap};

    let area = f.area();
    let bold = Style::default().add_modifier(Modifier::BOLD);

    // The status first (a narrow terminal cuts the line's end), then where and what.
    let mut title = vec![match (&app.error, app.last_ok) {
        (Some(e), last) => {
            let ago = last.map_or(String::new(), |t| {
                format!("; last reading {:.0} s ago", t.elapsed().as_secs_f64())
            });
            Span::styled(
                format!("disconnected, retrying ({e}{ago})"),
                Style::default()
                    .fg(Color::White)
                    .bg(Color::Red)
                    .add_modifier(Modifier::BOLD),
            )
        }
        (None, Some(_)) => Span::styled(
            "connected",
            Style::default()
                .fg(Color::Green)
                .add_modifier(Modifier::BOLD),
        ),
        (None, None) => Span::raw("connecting..."),
    }];
    title.push(Span::raw("  "));
    title.push(Span::styled("flowstate top ", bold));
    title.push(Span::raw(app.addr.to_string()));
    if let Some(v) = &app.view {
        if !v.title.is_empty() {
            title.push(Span::raw(format!(" · {}", v.title)));
        }
    }
    // The headline numbers wrap on a narrow terminal (up to three lines).
    let mut headline = Vec::new();
    for (k, v) in app.view.iter().flat_map(|v| &v.headline) {
        headline.push(Span::raw(format!("{k} ")));
        headline.push(Span::styled(format!("{v}  "), bold));
    }
    let wide: usize = headline.iter().map(|s| s.width()).sum();
    let head_h = wide.div_ceil(area.width.max(1) as usize).clamp(1, 3) as u16;
    let [top, head, spark, body, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(head_h),
        Constraint::Length(if area.height >= 24 { 3 } else { 0 }),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    f.render_widget(Paragraph::new(Line::from(title)), top);
    let Some(view) = &app.view else {
        f.render_widget(
            Paragraph::new(format!("waiting for the first reading of {}", app.addr)),
            body,
        );
        return;
    };
    f.render_widget(
        Paragraph::new(Line::from(headline)).wrap(Wrap { trim: true }),
        head,
    );
    if spark.height > 0 {
        let data: Vec<u64> = app.history.iter().copied().collect();
        let shown = &data[data.len().saturating_sub(spark.width as usize)..];
        f.render_widget(
            Sparkline::default()
                .data(shown)
                .style(Style::default().fg(Color::Cyan)),
            spark,
        );
    }

    // Tables: the side ones beside the others on a wide terminal, below them on a narrow one.
    let (main, side): (Vec<&Table>, Vec<&Table>) = view.tables.iter().partition(|t| !t.side);
    if body.width >= 110 && !side.is_empty() {
        let [l, r] = Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
            .areas(body);
        stack(f, &main, l);
        stack(f, &side, r);
    } else {
        let all: Vec<&Table> = main.into_iter().chain(side).collect();
        stack(f, &all, body);
    }
    f.render_widget(
        Paragraph::new(format!(
            "q quit · every {} · dashboard: http://{}/",
            humane(app.interval),
            app.addr
        ))
        .style(Style::default().fg(Color::DarkGray)),
        foot,
    );
}

/// Draws `tables` one below the other in `area`, each as tall as its rows.
fn stack(f: &mut ratatui::Frame, tables: &[&Table], area: ratatui::layout::Rect) {
    use ratatui::layout::Constraint;
    use ratatui::style::{Modifier, Style};
    use ratatui::text::Line;
    use ratatui::widgets::{Block, Borders, Cell, Row, Table as TableW};
    // Each table as tall as its rows, in order, while there is room; the last one shown takes
    // the rest. On a short terminal the first tables keep their rows and the last go.
    let mut areas = Vec::new();
    let mut y = area.y;
    let bottom = area.y + area.height;
    for (i, t) in tables.iter().enumerate() {
        let left = bottom.saturating_sub(y);
        if left < 3 {
            break;
        }
        let want = t.rows.len().max(1) as u16 + 3;
        let h = if i + 1 == tables.len() {
            left
        } else {
            want.min(left)
        };
        areas.push(ratatui::layout::Rect {
            y,
            height: h,
            ..area
        });
        y += h;
    }
    for (t, a) in tables.iter().zip(areas.iter()) {
        // The last text column takes what the others, as wide as their longest cell, leave.
        let widths: Vec<Constraint> = (0..t.header.len())
            .map(|i| {
                let w = t
                    .rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| c.chars().count())
                    .chain([t.header[i].chars().count()])
                    .max()
                    .unwrap_or(1);
                if i + 1 == t.text {
                    Constraint::Fill(1)
                } else if i < t.text {
                    Constraint::Length(w as u16)
                } else {
                    Constraint::Length(w.max(6) as u16)
                }
            })
            .collect();
        let cell = |i: usize, c: &str| {
            let l = Line::from(c.to_owned());
            Cell::from(if i < t.text { l } else { l.right_aligned() })
        };
        let rows: Vec<Row> = if t.rows.is_empty() {
            vec![Row::new(vec![Cell::from("none")])]
        } else {
            t.rows
                .iter()
                .map(|r| Row::new(r.iter().enumerate().map(|(i, c)| cell(i, c))))
                .collect()
        };
        let header = Row::new(t.header.iter().enumerate().map(|(i, h)| cell(i, h)))
            .style(Style::default().add_modifier(Modifier::BOLD));
        f.render_widget(
            TableW::new(rows, widths)
                .header(header)
                .column_spacing(1)
                .block(
                    Block::default()
                        .borders(Borders::ALL)
                        .title(t.title.as_str()),
                ),
            *a,
        );
    }
}

fn humane(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(packets_in: u64, wall_s: f64, sessions: i64) -> Value {
        serde_json::json!({
            "packets_in": packets_in, "packets_out": packets_in - 10, "dropped_total": 10,
            "reflected": 0, "skipped": 0, "wall_s": wall_s, "workers": 1, "backend": "local",
            "dropped": {"firewall.not_allowed": 10}, "malformed": {},
            "per_worker": [{"index": 0, "packets": packets_in, "packets_out": packets_in - 10,
                "busy_s": wall_s / 4.0, "state_flushes": 3, "state_errors": 0, "state_lost_ops": 0}],
            "nfs": [
                {"name": "firewall", "packets_in": packets_in, "forwarded": packets_in - 10,
                 "dropped": {"not_allowed": 10}, "report": {"connections": 4}},
                {"name": "anything", "packets_in": packets_in - 10, "forwarded": packets_in - 10,
                 "dropped": {}, "report": {"sessions": sessions, "pool_free": 100 - sessions, "never": 0}}
            ]
        })
    }

    #[test]
    fn rates_are_counter_deltas_over_the_process_clock() {
        let (first, prev) = View::build("chain", &summary(1000, 10.0, 5), None);
        assert_eq!(first.headline[0], ("in/s".into(), "-".into()));
        // Two seconds later on the process's clock (our own clock says otherwise).
        let (v, _) = View::build(
            "chain",
            &summary(5000, 12.0, 7),
            Some((&prev, Duration::from_millis(10))),
        );
        assert_eq!(v.headline[0], ("in/s".into(), "2000".into()));
        assert_eq!(v.rate, Some(2000.0));
        assert!(
            v.title.starts_with("chain · state local · 1 worker(s)"),
            "{}",
            v.title
        );
        let nfs = &v.tables[0];
        assert_eq!(
            nfs.rows[0],
            ["firewall", "2000", "2000", "0.0", "5000", "10"]
        );
        assert_eq!(
            nfs.rows[1][0], "anything",
            "NFs are what the document lists"
        );
        assert_eq!(v.tables[1].rows, [["firewall", "not_allowed", "0.0", "10"]]);
        assert_eq!(v.tables[2].rows[0][2], "25%", "busy share");
        let reports = v.tables.iter().find(|t| t.side).unwrap();
        assert_eq!(
            reports.rows,
            [
                ["firewall", "connections", "4"],
                ["anything", "pool_free", "93"],
                ["anything", "sessions", "7"]
            ]
        );
        // An entry that has been zero all along is left out; one that was not stays.
        let (_, prev) = View::build("", &summary(100, 1.0, 3), None);
        let (later, _) = View::build(
            "",
            &summary(200, 2.0, 0),
            Some((&prev, Duration::from_secs(1))),
        );
        let reports = later.tables.iter().find(|t| t.side).unwrap();
        assert!(reports
            .rows
            .contains(&vec!["anything".into(), "sessions".into(), "0".into()]));
        assert!(!reports.rows.iter().any(|r| r[1] == "never"), "{reports:?}");
        let text = v.text();
        assert!(text.contains("firewall  2000"), "{text}");
    }

    #[test]
    fn a_counter_that_goes_back_has_no_rate() {
        let (_, prev) = View::build("", &summary(5000, 12.0, 5), None);
        let (v, _) = View::build(
            "",
            &summary(100, 0.5, 5),
            Some((&prev, Duration::from_secs(1))),
        );
        assert_eq!(v.headline[0].1, "-", "the process restarted");
        assert_eq!(v.tables[0].rows[0][1], "-");
    }

    #[test]
    fn the_store_shows_operations_by_type() {
        let doc = |get: u64, up: f64| {
            serde_json::json!({"ops": {"get": get, "add": 10, "lock": 0}, "connections": 2, "objects": 7,
                "errors": 0, "uptime_s": up, "shards": 2})
        };
        let (_, prev) = View::build("store", &doc(100, 1.0), None);
        let (v, _) = View::build(
            "store",
            &doc(600, 1.5),
            Some((&prev, Duration::from_secs(1))),
        );
        assert_eq!(v.headline[0], ("ops/s".into(), "1000".into()));
        assert_eq!(
            v.tables[0].rows,
            [
                ["add", "0.0", "10"],
                ["get", "1000", "600"],
                ["all", "1000", "610"]
            ],
            "operations never applied are left out"
        );
        assert!(v.tables[1]
            .rows
            .contains(&vec!["objects".into(), "7".into()]));
    }

    #[test]
    fn addresses_as_users_type_them() {
        assert_eq!(resolve("9464").unwrap(), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(
            resolve("http://127.0.0.1:9000/").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(resolve("localhost:9000").unwrap().port(), 9000);
        assert!(resolve("no such host").is_err());
        assert!(interval("10ms").is_err());
        assert_eq!(interval("500ms").unwrap(), Duration::from_millis(500));
    }

    #[test]
    fn the_screen_draws_on_a_narrow_terminal_and_a_wide_one() {
        use ratatui::backend::TestBackend;
        let (_, prev) = View::build("chain", &summary(1000, 10.0, 5), None);
        let (view, _) = View::build(
            "chain",
            &summary(5000, 12.0, 7),
            Some((&prev, Duration::from_secs(2))),
        );
        for (w, h) in [(30, 10), (80, 24), (160, 50)] {
            let mut t = ratatui::Terminal::new(TestBackend::new(w, h)).unwrap();
            let app = App {
                addr: "127.0.0.1:9464".parse().unwrap(),
                interval: Duration::from_secs(1),
                view: Some(view.clone()),
                prev: None,
                last_ok: Some(Instant::now()),
                error: Some("connection refused".into()),
                history: [1, 5, 3].into(),
            };
            t.draw(|f| draw(f, &app)).unwrap();
            let screen: String = t
                .backend()
                .buffer()
                .content
                .iter()
                .map(|c| c.symbol())
                .collect();
            assert!(screen.contains("disconnect"), "{w}x{h}: {screen}");
            if w >= 80 {
                assert!(screen.contains("firewall"), "{w}x{h}: {screen}");
                assert!(screen.contains("anything"), "{w}x{h}: {screen}");
            }
            if w >= 160 {
                assert!(screen.contains("pool_free"), "{w}x{h}: {screen}");
            }
        }
    }
}
