//! What the integration tests share (the lab tests, `live.rs` and `cluster.rs`; the browser and
//! terminal tests, `report.rs`, `live.rs` and `store.rs`; the stores over TLS, `cassandra.rs`
//! and `redis_backends.rs`). Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Deterministic pseudo-random bytes (xorshift), so content errors cannot hide in zeros.
pub(crate) fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A tool the test needs (`chromium`, `tmux`): missing it is a failure in CI and a skip
/// elsewhere (`None`). The first of `names` that runs with `version_arg` is taken.
pub(crate) fn tool(names: &[&'static str], version_arg: &str) -> Option<&'static str> {
    let found = names.iter().copied().find(|c| {
        Command::new(c)
            .arg(version_arg)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() && std::env::var_os("CI").is_none() {
        eprintln!(
            "SKIPPED: {} not found (scripts/setup installs it)",
            names[0]
        );
        return None;
    }
    assert!(
        found.is_some(),
        "{} is required in CI (scripts/setup installs it)",
        names[0]
    );
    found
}

/// Chromium renders pages: missing it is a failure in CI and a skip elsewhere.
pub(crate) fn chromium() -> Option<&'static str> {
    tool(&["chromium", "chromium-browser"], "--version")
}

/// Runs headless Chromium on `url` with `args`, behind `prefix` (e.g. `ip netns exec NS`, or
/// nothing); a hung browser is killed after two minutes (a guard, not a timing assertion).
/// Its output goes through files beside the profile, so a large `--dump-dom` never waits on a
/// full pipe.
pub(crate) fn headless(
    prefix: &[&str],
    browser: &str,
    profile: &Path,
    args: &[&str],
    url: &str,
) -> Output {
    std::fs::create_dir_all(profile).unwrap();
    let (out_path, err_path) = (profile.join("stdout"), profile.join("stderr"));
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.push(browser.to_owned());
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::from(std::fs::File::create(&out_path).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within two minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// The DOM headless Chromium dumped (`out`) of a dashboard whose script polled at least three
/// times, connected, and names the process's role `role`.
#[allow(dead_code)]
pub(crate) fn polled_dashboard(out: Output, role: &str) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8(out.stdout).unwrap();
    let polls: u32 = dom
        .split("data-polls=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the page polled: {dom}"));
    assert!(polls >= 3, "{polls} polls");
    assert!(dom.contains("data-state=\"connected\""), "{dom}");
    assert!(
        dom.contains(&format!("<span id=\"role\">{role}</span>")),
        "{dom}"
    );
    dom
}

/// A `width`×`height` screenshot of `url` in headless Chromium (run behind `prefix`, e.g. `ip
/// netns exec NS`) after `budget_ms` of virtual time: its pixels, and how many distinct
/// colours they have. Fails the test if Chromium fails or the page is blank.
#[allow(dead_code)]
pub(crate) fn screenshot(
    prefix: &[&str],
    browser: &str,
    profile: &Path,
    url: &str,
    (width, height): (u32, u32),
) -> Vec<(u8, u8, u8)> {
    let shot = profile.with_extension("png");
    let out = headless(
        prefix,
        browser,
        profile,
        &[
            "--virtual-time-budget=6000",
            &format!("--screenshot={}", shot.display()),
            &format!("--window-size={width},{height}"),
        ],
        url,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (w, h, pixels) = png_pixels(&shot);
    assert_eq!((w, h), (width, height));
    let colours: std::collections::HashSet<_> = pixels.iter().collect();
    assert!(
        colours.len() > 20,
        "a blank page: {} colours",
        colours.len()
    );
    pixels
}

/// A PNG's pixels as RGB triples, and its size.
pub(crate) fn png_pixels(path: &Path) -> (u32, u32, Vec<(u8, u8, u8)>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(path).expect("screenshot written"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
    let info = reader.next_frame(&mut buf).expect("PNG frame");
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(channels)
        .map(|p| (p[0], p[1], p[2]))
        .collect();
    (info.width, info.height, pixels)
}

/// The elements of `html` that open with `<tag` and carry `attr="value"`: each from its `<`
/// to the end of the document (the caller cuts where it needs).
pub(crate) fn elements<'a>(html: &'a str, tag: &str, attr: &str, value: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let want = format!("{attr}=\"{value}\"");
    html.match_indices(&open)
        .map(|(i, _)| &html[i..])
        .filter(|e| e[..e.find('>').unwrap_or(e.len())].contains(&want))
        .collect()
}

/// The value of `attr` in the first tag of `element`.
pub(crate) fn attr<'a>(element: &'a str, attr: &str) -> Option<&'a str> {
    let tag = &element[..element.find('>')?];
    let key = format!(" {attr}=\"");
    let start = tag.find(&key)? + key.len();
    Some(&tag[start..start + tag[start..].find('"')?])
}

/// A tmux server of the test's own (`tmux -L NAME`, no configuration file), killed on drop.
pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    /// A server named after `name` and the test process; `None` (skipped) without tmux.
    pub(crate) fn new(name: &str) -> Option<Tmux> {
        tool(&["tmux"], "-V")?;
        Some(Tmux {
            socket: format!("flowstate-{name}-{}", std::process::id()),
        })
    }

    /// Runs `tmux ARGS` on this server; its stdout.
    pub(crate) fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts `command` (a shell command line) in a detached session `name` of `w`×`h`.
    pub(crate) fn start(&self, name: &str, w: u16, h: u16, command: &str) {
        self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            &w.to_string(),
            "-y",
            &h.to_string(),
            command,
        ]);
    }

    /// What the pane of session `name` shows now.
    pub(crate) fn capture(&self, name: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", name])
    }

    /// Waits (at most `limit`, a guard) until the pane shows something `ok` accepts; the last
    /// screen either way.
    pub(crate) fn wait_for(
        &self,
        name: &str,
        limit: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> (bool, String) {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.capture(name);
            if ok(&screen) || Instant::now() > deadline {
                return (ok(&screen), screen);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
        // A killed server leaves its socket file behind (tmux(1): TMUX_TMPDIR, else /tmp,
        // then tmux-UID/NAME).
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            });
        if let Some(uid) = uid {
            let dir = std::env::var_os("TMUX_TMPDIR").unwrap_or_else(|| "/tmp".into());
            let _ = std::fs::remove_file(
                Path::new(&dir)
                    .join(format!("tmux-{uid}"))
                    .join(&self.socket),
            );
        }
    }
}

/// The shell command line that runs `argv` in a tmux pane, then says how it ended and whether
/// the terminal is back in its ordinary mode (`stty` shows `icanon` and `echo`, not `-icanon`
/// `-echo` as raw mode does), and stays so the pane can be read.
pub(crate) fn pane_command(argv: &[&str]) -> String {
    let quoted: Vec<String> = argv
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    format!(
        "{}; echo \"exited $?\"; echo \"tty $(stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' ')\"; sleep 600",
        quoted.join(" ")
    )
}

/// A number as `flowstate top` shows rates: `12.5`, `1234`, `45.6k`, `1.23M`, `2.00G`.
pub(crate) fn si(s: &str) -> Option<f64> {
    let (n, scale) = match s.as_bytes().last()? {
        b'k' => (&s[..s.len() - 1], 1e3),
        b'M' => (&s[..s.len() - 1], 1e6),
        b'G' => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    n.parse::<f64>().ok().map(|v| v * scale)
}

/// The rows of the tables on a terminal screen: each line's cells, borders left out.
pub(crate) fn rows(screen: &str) -> impl Iterator<Item = Vec<String>> + '_ {
    screen
        .lines()
        .map(|l| {
            l.replace(['│', '┌', '┐', '└', '┘', '─'], " ")
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|cells| !cells.is_empty())
}

/// The TLS test files of `scripts/tls-certs` (`$FLOWSTATE_RUN_DIR/tls`, default `.run/tls`).
pub(crate) fn tls_file(name: &str) -> String {
    std::env::var_os("FLOWSTATE_RUN_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.run"))
        .join("tls")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// `text` with the keys of its `[state]` table replaced by `state`.
pub(crate) fn with_state(text: &str, state: &str) -> String {
    let mut out = String::new();
    let mut in_state = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_state = t == "[state]";
            out.push_str(line);
            out.push('\n');
            if in_state {
                out.push_str(state);
                out.push('\n');
            }
        } else if !in_state {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// An HTTP server, `python3 -c HTTP_PY ADDRESS PORT DIRECTORY`, on an IPv4 or IPv6 address,
/// without http.server's reverse lookup of the address it binds (which waits on DNS).
pub(crate) const HTTP_PY: &str = r#"
import functools, http.server, socket, socketserver, sys
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
S((sys.argv[1], int(sys.argv[2])), h).serve_forever()
"#;

/// The commands that give the lab's hosts IPv6 (which the lab turns off on their links; the
/// box's namespace keeps it off): the client `fd00:1::2/64` on `client_if` in `client_ns`,
/// its default route via the box's `fd00:1::1`; the server `servers` (in `fd00:2::/64`) on
/// `server_if` in `server_ns`, its route back via the box's `fd00:2::1`.
pub(crate) fn ipv6_hosts(
    (client_ns, client_if): (&str, &str),
    (server_ns, server_if): (&str, &str),
    servers: &[&str],
) -> Vec<Command> {
    let mut steps: Vec<(&str, Vec<String>)> = Vec::new();
    let ip6 = |args: &[&str]| {
        ["ip", "-6"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    for (ns, dev) in [(client_ns, client_if), (server_ns, server_if)] {
        let on = format!("net.ipv6.conf.{dev}.disable_ipv6=0");
        steps.push((ns, vec!["sysctl".into(), "-qw".into(), on]));
    }
    steps.push((
        client_ns,
        ip6(&["addr", "add", "fd00:1::2/64", "dev", client_if, "nodad"]),
    ));
    steps.push((
        client_ns,
        ip6(&["route", "add", "default", "via", "fd00:1::1"]),
    ));
    for s in servers {
        let a = format!("{s}/64");
        steps.push((
            server_ns,
            ip6(&["addr", "add", &a, "dev", server_if, "nodad"]),
        ));
    }
    steps.push((
        server_ns,
        ip6(&["route", "add", "fd00:1::/64", "via", "fd00:2::1"]),
    ));
    steps
        .into_iter()
        .map(|(ns, argv)| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns])
                .args(argv)
                .stdin(Stdio::null());
            c
        })
        .collect()
}

/// Runs `commands`, each of which must succeed.
pub(crate) fn run_all(commands: Vec<Command>) {
    for mut c in commands {
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
