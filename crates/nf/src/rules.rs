//! Signature rules in a subset of Suricata's language, read from ordinary `.rules` files: what
//! the IPS (issue #17) matches reassembled streams against. Only the parsing and the header
//! matching live here; payload matching is the IPS's.
//!
//! ```text
//! alert tcp $EXTERNAL_NET any -> $HOME_NET 80 (msg:"x"; flow:to_server,established; \
//!     content:"GET"; depth:3; content:"|2e 2e 2f|"; distance:0; nocase; sid:1; rev:2;)
//! ```
//!
//! Supported (Suricata 7 rule format, `doc/userguide/rules/intro.rst`):
//! * actions `alert`, `drop`; protocols `tcp`, `udp`, `ip`; directions `->` and `<>`;
//! * addresses and ports: `any`, an address or CIDR prefix (host bits are masked, as Suricata
//!   does), a port, a range `a:b` (`a:` and `:b` open-ended), negation `!x`, lists `[x, y, ...]`
//!   (nested; a list matches its positive items, or anything if it has none, minus its negated
//!   ones), and variables `$NAME` ([`Vars`], with `suricata.yaml`'s defaults);
//! * options `msg`, `sid`, `rev`, `classtype`, `priority`, `flow` (`to_server`, `to_client`,
//!   `from_client`, `from_server`, `established`, `not_established`, `stateless`), `content`
//!   (quoted, with `|hex|` bytes and `\"`, `\;`, `\\` escapes, `!` negation) and its
//!   modifiers `nocase`, `offset`, `depth`, `distance`, `within`, `fast_pattern`;
//! * `metadata` and `reference` are accepted and ignored (they do not change what matches).
//!
//! Promises: any other keyword, action or protocol is an error naming the file, the line and
//! the keyword — or, with [`Options::skip_unsupported`], the rule is skipped and counted. No
//! input makes the parser panic (property-tested). A rule spans lines ending in `\`; `#`
//! starts a comment line.

use flowstate_config::{IpNet, PrefixMatch};
use std::collections::HashMap;
use std::net::IpAddr;

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Log an alert.
    Alert,
    /// Log an alert, drop the packet and stop the flow.
    Drop,
}

/// The protocols a rule's header matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP only.
    Tcp,
    /// UDP only.
    Udp,
    /// Any IP packet.
    Ip,
}

/// An address expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// Any address.
    Any,
    /// A prefix.
    Prefix(IpNet),
    /// Not this.
    Not(Box<Addr>),
    /// A list: its positive items (or anything, if it has none) minus its negated ones.
    List(Vec<Addr>),
}

impl Addr {
    /// Whether `ip` matches.
    pub fn matches(&self, ip: &IpAddr) -> bool {
        match self {
            Addr::Any => true,
            Addr::Prefix(p) => p.matches(ip),
            Addr::Not(a) => !a.matches(ip),
            Addr::List(items) => list_matches(
                items,
                |a| a.matches(ip),
                |a| match a {
                    Addr::Not(inner) => Some(&**inner),
                    _ => None,
                },
            ),
        }
    }
}

/// A port expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Port {
    /// Any port.
    Any,
    /// An inclusive range (a single port is `n..=n`).
    Range(u16, u16),
    /// Not this.
    Not(Box<Port>),
    /// A list, as [`Addr::List`].
    List(Vec<Port>),
}

impl Port {
    /// Whether `port` matches.
    pub fn matches(&self, port: u16) -> bool {
        match self {
            Port::Any => true,
            Port::Range(a, b) => (*a..=*b).contains(&port),
            Port::Not(p) => !p.matches(port),
            Port::List(items) => list_matches(
                items,
                |p| p.matches(port),
                |p| match p {
                    Port::Not(inner) => Some(&**inner),
                    _ => None,
                },
            ),
        }
    }
}

/// Suricata's list semantics: in a positive item (or anything, without one) and in no negated
/// one.
fn list_matches<T>(
    items: &[T],
    matches: impl Fn(&T) -> bool,
    negated: impl Fn(&T) -> Option<&T>,
) -> bool {
    let mut any_positive = false;
    let mut positive = false;
    for i in items {
        match negated(i) {
            Some(inner) => {
                if matches(inner) {
                    return false;
                }
            }
            None => {
                any_positive = true;
                positive |= matches(i);
            }
        }
    }
    positive || !any_positive
}

/// `flow:` conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    /// `to_server` / `from_client`: only packets from the connection's initiator.
    pub to_server: bool,
    /// `to_client` / `from_server`: only packets from the responder.
    pub to_client: bool,
    /// `established`: only once the handshake completed.
    pub established: bool,
    /// `not_established`: only before that.
    pub not_established: bool,
    /// `stateless`: whatever the connection's state.
    pub stateless: bool,
}

/// One `content` and its modifiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    /// The bytes to find.
    pub pattern: Vec<u8>,
    /// `!`: the pattern must not be there.
    pub negated: bool,
    /// `nocase`: ASCII letters match either case.
    pub nocase: bool,
    /// `offset`: the match starts at least this far into the buffer.
    pub offset: Option<u32>,
    /// `depth`: the match ends within this many bytes of `offset`.
    pub depth: Option<u32>,
    /// `distance`: the match starts at least this far after the previous content's match
    /// (may be negative); on a rule's first content, after the buffer's start.
    pub distance: Option<i32>,
    /// `within`: the match ends within this many bytes after the previous content's match (on
    /// the first content, after the buffer's start).
    pub within: Option<u32>,
    /// `fast_pattern`: the pattern the prefilter should use for the rule.
    pub fast_pattern: bool,
}

/// A parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// alert or drop.
    pub action: Action,
    /// tcp, udp or ip.
    pub proto: Proto,
    /// Source addresses.
    pub src: Addr,
    /// Source ports.
    pub sport: Port,
    /// `<>`: the header matches in either direction.
    pub bidirectional: bool,
    /// Destination addresses.
    pub dst: Addr,
    /// Destination ports.
    pub dport: Port,
    /// `msg`.
    pub msg: String,
    /// `sid` (required).
    pub sid: u32,
    /// `rev` (default 0).
    pub rev: u32,
    /// `classtype`.
    pub classtype: Option<String>,
    /// `priority`.
    pub priority: Option<u8>,
    /// `flow`.
    pub flow: Flow,
    /// The contents, in order.
    pub contents: Vec<Content>,
    /// Where it was read: line number (1-based) of its first line.
    pub line: usize,
}

impl Rule {
    /// Whether the header matches a packet from `src`:`sport` to `dst`:`dport` of protocol
    /// `proto` (6 TCP, 17 UDP).
    pub fn header_matches(
        &self,
        proto: u8,
        src: IpAddr,
        sport: u16,
        dst: IpAddr,
        dport: u16,
    ) -> bool {
        let p = match self.proto {
            Proto::Tcp => proto == 6,
            Proto::Udp => proto == 17,
            Proto::Ip => true,
        };
        let forward = |s: &IpAddr, sp, d: &IpAddr, dp| {
            self.src.matches(s)
                && self.sport.matches(sp)
                && self.dst.matches(d)
                && self.dport.matches(dp)
        };
        p && (forward(&src, sport, &dst, dport)
            || (self.bidirectional && forward(&dst, dport, &src, sport)))
    }

    /// Whether the contents match `buf` (a packet's payload, or a stream's bytes from its
    /// start), as Suricata's content inspection decides: contents in order, each searched in
    /// its window — absolute (`offset`, `depth`), or relative to the end of the previous
    /// content's match (`distance`, `within` counted from `distance`; on a first content, from
    /// the buffer's start) — going back to a later occurrence of an earlier content when a
    /// later one fails. A negated content holds when its pattern is nowhere in its window, and
    /// leaves the position where it was. A rule without contents matches. At most
    /// [`MATCH_BUDGET`] occurrences are tried (Suricata's `inspection-recursion-limit`); past
    /// that the rule does not match.
    pub fn payload_matches(&self, buf: &[u8]) -> bool {
        let mut budget = MATCH_BUDGET;
        contents_match(&self.contents, buf, 0, &mut budget)
    }
}

/// Occurrences [`Rule::payload_matches`] tries at most.
pub const MATCH_BUDGET: u32 = 3000;

/// The start positions content `c` may match at, after a previous match ending at `prev_end`:
/// `start..=last` (empty when `start > last`).
fn window(c: &Content, len: usize, prev_end: usize) -> (usize, usize) {
    let n = c.pattern.len();
    let (lo, hi) = if c.distance.is_some() || c.within.is_some() {
        let base = prev_end as i64 + i64::from(c.distance.unwrap_or(0));
        let hi = c.within.map_or(len as i64, |w| base + i64::from(w));
        (base.max(0), hi)
    } else {
        let lo = i64::from(c.offset.unwrap_or(0));
        (lo, c.depth.map_or(len as i64, |d| lo + i64::from(d)))
    };
    let hi = hi.min(len as i64);
    let last = hi - n as i64;
    if last < lo {
        return (1, 0);
    }
    (lo as usize, last as usize)
}

fn occurs_at(c: &Content, buf: &[u8], at: usize) -> bool {
    let hay = &buf[at..at + c.pattern.len()];
    if c.nocase {
        hay.eq_ignore_ascii_case(&c.pattern)
    } else {
        hay == c.pattern.as_slice()
    }
}

fn contents_match(contents: &[Content], buf: &[u8], prev_end: usize, budget: &mut u32) -> bool {
    let Some((c, rest)) = contents.split_first() else {
        return true;
    };
    let (lo, last) = window(c, buf.len(), prev_end);
    if c.negated {
        let found = (lo..=last).any(|p| lo <= last && occurs_at(c, buf, p));
        return !found && contents_match(rest, buf, prev_end, budget);
    }
    if lo > last {
        return false;
    }
    for p in lo..=last {
        if !occurs_at(c, buf, p) {
            continue;
        }
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        if contents_match(rest, buf, p + c.pattern.len(), budget) {
            return true;
        }
    }
    false
}

/// Address and port variables (`$HOME_NET`, `$HTTP_PORTS`, ...), as `suricata.yaml`'s `vars`.
#[derive(Debug, Clone)]
pub struct Vars(HashMap<String, String>);

impl Default for Vars {
    /// `suricata.yaml`'s defaults.
    fn default() -> Self {
        let v = [
            ("HOME_NET", "[192.168.0.0/16,10.0.0.0/8,172.16.0.0/12]"),
            ("EXTERNAL_NET", "!$HOME_NET"),
            ("HTTP_SERVERS", "$HOME_NET"),
            ("SMTP_SERVERS", "$HOME_NET"),
            ("SQL_SERVERS", "$HOME_NET"),
            ("DNS_SERVERS", "$HOME_NET"),
            ("TELNET_SERVERS", "$HOME_NET"),
            ("HTTP_PORTS", "80"),
            ("SHELLCODE_PORTS", "!80"),
            ("ORACLE_PORTS", "1521"),
            ("SSH_PORTS", "22"),
            ("FTP_PORTS", "21"),
            ("FILE_DATA_PORTS", "[$HTTP_PORTS,110,143]"),
        ];
        Vars(
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
}

impl Vars {
    /// Sets `$name` to `value` (an address or port expression).
    pub fn set(&mut self, name: &str, value: &str) {
        self.0.insert(name.to_owned(), value.to_owned());
    }
}

/// How a rule file is read.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The variables.
    pub vars: Vars,
    /// Rules with an unsupported keyword, action or protocol are skipped and counted instead
    /// of failing the file.
    pub skip_unsupported: bool,
}

/// A rule file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {reason}")]
pub struct RuleError {
    /// The file (as given).
    pub file: String,
    /// The line (1-based).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
    /// Whether it is an unsupported feature (skippable) rather than a malformed rule.
    pub unsupported: bool,
}

/// The rules of a file and what was skipped.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    /// The rules, in file order.
    pub rules: Vec<Rule>,
    /// Rules skipped for an unsupported keyword, with why.
    pub skipped: Vec<RuleError>,
}

/// Parses the text of a rule file named `file`.
pub fn parse(file: &str, text: &str, o: &Options) -> Result<RuleSet, RuleError> {
    let mut set = RuleSet::default();
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if pending.is_empty() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            start = i + 1;
        }
        if let Some(cont) = line.strip_suffix('\\') {
            pending.push_str(cont);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let rule = std::mem::take(&mut pending);
        match parse_rule(&rule, &o.vars) {
            Ok(mut r) => {
                r.line = start;
                set.rules.push(r);
            }
            Err((reason, unsupported)) => {
                let e = RuleError {
                    file: file.to_owned(),
                    line: start,
                    reason,
                    unsupported,
                };
                if unsupported && o.skip_unsupported {
                    set.skipped.push(e);
                } else {
                    return Err(e);
                }
            }
        }
    }
    if !pending.is_empty() {
        return Err(RuleError {
            file: file.to_owned(),
            line: start,
            reason: "the rule's last line ends in `\\` and nothing follows".into(),
            unsupported: false,
        });
    }
    Ok(set)
}

/// Why a rule is refused: the reason, and whether the feature is merely unsupported.
type Refusal = (String, bool);

fn bad(reason: impl Into<String>) -> Refusal {
    (reason.into(), false)
}

fn unsupported(reason: impl Into<String>) -> Refusal {
    (reason.into(), true)
}

fn parse_rule(text: &str, vars: &Vars) -> Result<Rule, Refusal> {
    let open = text
        .find('(')
        .ok_or_else(|| bad("no options: a rule ends with `(...)`"))?;
    let body = text[open + 1..]
        .trim_end()
        .strip_suffix(')')
        .ok_or_else(|| bad("the options do not end with `)`"))?;
    let header = header_fields(&text[..open])?;
    let [action, proto, src, sport, dir, dst, dport] = header.as_slice() else {
        return Err(bad(format!(
            "the header has {} fields; expected `action proto src sport -> dst dport`",
            header.len()
        )));
    };
    let (action, proto, dir) = (action.as_str(), proto.as_str(), dir.as_str());
    let action = match action {
        "alert" => Action::Alert,
        "drop" => Action::Drop,
        "pass" | "reject" | "rejectsrc" | "rejectdst" | "rejectboth" => {
            return Err(unsupported(format!("action `{action}` is not supported")))
        }
        _ => return Err(bad(format!("`{action}` is not an action"))),
    };
    let proto = match proto {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        "ip" => Proto::Ip,
        _ => return Err(unsupported(format!("protocol `{proto}` is not supported"))),
    };
    let bidirectional = match dir {
        "->" => false,
        "<>" => true,
        "<-" => {
            return Err(bad(
                "`<-` is not a direction Suricata accepts; write `->` the other way",
            ))
        }
        _ => return Err(bad(format!("`{dir}` is not a direction (`->` or `<>`)"))),
    };
    let mut rule = Rule {
        action,
        proto,
        src: addr(src, vars, 0)?,
        sport: port(sport, vars, 0)?,
        bidirectional,
        dst: addr(dst, vars, 0)?,
        dport: port(dport, vars, 0)?,
        msg: String::new(),
        sid: 0,
        rev: 0,
        classtype: None,
        priority: None,
        flow: Flow::default(),
        contents: Vec::new(),
        line: 0,
    };
    let mut sid = None;
    let mut once = std::collections::HashSet::new();
    for (key, value) in options(body)? {
        let need = |what: &str| {
            value
                .clone()
                .ok_or_else(|| bad(format!("`{key}` needs {what}")))
        };
        match key.as_str() {
            "msg" | "sid" | "rev" if !once.insert(key.clone()) => {
                return Err(bad(format!("`{key}` given twice")))
            }
            "msg" => rule.msg = unquote(&need("a quoted text")?)?,
            "sid" => sid = Some(number::<u32>(&key, &need("a number")?)?),
            "rev" => rule.rev = number(&key, &need("a number")?)?,
            "classtype" => rule.classtype = Some(need("a name")?),
            "priority" => rule.priority = Some(number(&key, &need("a number")?)?),
            "flow" => {
                for f in need("conditions")?.split(',') {
                    match f.trim() {
                        "to_server" | "from_client" => rule.flow.to_server = true,
                        "to_client" | "from_server" => rule.flow.to_client = true,
                        "established" => rule.flow.established = true,
                        "not_established" => rule.flow.not_established = true,
                        "stateless" => rule.flow.stateless = true,
                        other => {
                            return Err(unsupported(format!(
                                "flow condition `{other}` is not supported"
                            )))
                        }
                    }
                }
                if rule.flow.to_server && rule.flow.to_client {
                    return Err(bad("flow: to_server and to_client together match nothing"));
                }
            }
            "content" => {
                let v = need("a quoted pattern")?;
                let (negated, v) = match v.strip_prefix('!') {
                    Some(rest) => (true, rest.trim_start().to_owned()),
                    None => (false, v),
                };
                let pattern = content_bytes(&unquote(&v)?)?;
                if pattern.is_empty() {
                    return Err(bad("content: an empty pattern"));
                }
                rule.contents.push(Content {
                    pattern,
                    negated,
                    nocase: false,
                    offset: None,
                    depth: None,
                    distance: None,
                    within: None,
                    fast_pattern: false,
                });
            }
            "nocase" => {
                let c = last_content(&mut rule, &key)?;
                once_per_content(&key, c.nocase)?;
                c.nocase = true;
            }
            "fast_pattern" => {
                if rule.contents.iter().any(|c| c.fast_pattern) {
                    return Err(bad("fast_pattern is for one content of a rule"));
                }
                last_content(&mut rule, &key)?.fast_pattern = true;
            }
            "offset" | "depth" => {
                let n: u32 = number(&key, &need("a number")?)?;
                let c = last_content(&mut rule, &key)?;
                let slot = if key == "offset" {
                    &mut c.offset
                } else {
                    &mut c.depth
                };
                once_per_content(&key, slot.is_some())?;
                *slot = Some(n);
                if c.distance.is_some() || c.within.is_some() {
                    return Err(bad(MIXED));
                }
                if key == "depth" && (n as usize) < c.pattern.len() {
                    return Err(bad("depth is shorter than its content"));
                }
            }
            "distance" => {
                let n = number(&key, &need("a number")?)?;
                let c = last_content(&mut rule, &key)?;
                once_per_content(&key, c.distance.is_some())?;
                if c.offset.is_some() || c.depth.is_some() {
                    return Err(bad(MIXED));
                }
                c.distance = Some(n);
            }
            "within" => {
                let n: u32 = number(&key, &need("a number")?)?;
                let c = last_content(&mut rule, &key)?;
                once_per_content(&key, c.within.is_some())?;
                if c.offset.is_some() || c.depth.is_some() {
                    return Err(bad(MIXED));
                }
                if (n as usize) < c.pattern.len() {
                    return Err(bad("within is shorter than its content"));
                }
                c.within = Some(n);
            }
            "metadata" | "reference" => {}
            other => return Err(unsupported(format!("keyword `{other}` is not supported"))),
        }
    }
    rule.sid = sid.ok_or_else(|| bad("no `sid`"))?;
    Ok(rule)
}

/// The header's fields, split at whitespace outside `[...]` (lists may hold spaces).
fn header_fields(h: &str) -> Result<Vec<String>, Refusal> {
    let (mut fields, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in h.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        if c.is_whitespace() && depth == 0 {
            if !cur.is_empty() {
                fields.push(std::mem::take(&mut cur));
            }
        } else if !c.is_whitespace() {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        fields.push(cur);
    }
    if depth != 0 {
        return Err(bad("the header's brackets do not balance"));
    }
    Ok(fields)
}

/// A content's position is absolute (`offset`, `depth`) or relative to the previous match
/// (`distance`, `within`), not both.
const MIXED: &str = "a content's offset/depth (absolute) and distance/within (relative) do not mix";

/// A content modifier given twice is refused (as Suricata does).
fn once_per_content(key: &str, already: bool) -> Result<(), Refusal> {
    if already {
        return Err(bad(format!("`{key}` given twice for the same content")));
    }
    Ok(())
}

/// The content a modifier `key` applies to: the rule's latest.
fn last_content<'r>(rule: &'r mut Rule, key: &str) -> Result<&'r mut Content, Refusal> {
    rule.contents
        .last_mut()
        .ok_or_else(|| bad(format!("`{key}` must follow a `content`")))
}

/// Splits `key[:value];` options; values may be quoted (with `\"`, `\;`, `\\` escapes).
fn options(body: &str) -> Result<Vec<(String, Option<String>)>, Refusal> {
    let mut out = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        let mut value: Option<String> = None;
        let mut quoted = false;
        let mut ended = false;
        while let Some(c) = chars.next() {
            match (c, &mut value) {
                // An unescaped `;` ends the option, quoted or not (as Suricata reads it).
                (';', _) => {
                    ended = true;
                    break;
                }
                (':', None) => value = Some(String::new()),
                (c, None) => key.push(c),
                ('\\', Some(v)) => {
                    // Kept escaped for `unquote`, which knows what it may escape.
                    v.push('\\');
                    match chars.next() {
                        Some(n) => v.push(n),
                        None => return Err(bad("an option ends in `\\`")),
                    }
                }
                ('"', Some(v)) => {
                    quoted = !quoted;
                    v.push('"');
                }
                (c, Some(v)) => v.push(c),
            }
        }
        if quoted {
            return Err(bad(format!(
                "option `{}`: a quote is not closed (a `;` in a text is written `\\;`)",
                key.trim()
            )));
        }
        if !ended {
            return Err(bad(format!(
                "option `{}` does not end with `;`",
                key.trim()
            )));
        }
        let key = key.trim().to_owned();
        if key.is_empty() {
            return Err(bad("an empty option (`;;`)"));
        }
        out.push((key, value.map(|v| v.trim().to_owned())));
    }
}

/// The text between quotes, escapes resolved.
fn unquote(v: &str) -> Result<String, Refusal> {
    let inner = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| bad(format!("{v:?} is not quoted")))?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | ';' | '\\' | ':')) => out.push(e),
                Some(e) => return Err(bad(format!("`\\{e}` is not an escape rules allow"))),
                None => return Err(bad("a text ends in `\\`")),
            },
            '"' => return Err(bad("an unescaped `\"` inside a quoted text")),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A content's bytes: text with `|41 42|` hex sections.
fn content_bytes(s: &str) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(s.len());
    let mut parts = s.split('|');
    let mut hex = false;
    if let Some(first) = parts.next() {
        out.extend_from_slice(first.as_bytes());
    }
    for part in parts {
        hex = !hex;
        if !hex {
            out.extend_from_slice(part.as_bytes());
            continue;
        }
        let digits: Vec<u8> = part.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !digits.len().is_multiple_of(2) {
            return Err(bad(format!("|{part}|: an odd number of hex digits")));
        }
        for pair in digits.chunks(2) {
            let byte = std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| bad(format!("|{part}| is not hex")))?;
            out.push(byte);
        }
    }
    if hex {
        return Err(bad("a `|` hex section is not closed"));
    }
    Ok(out)
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, Refusal> {
    v.trim()
        .parse()
        .map_err(|_| bad(format!("`{key}`: {v:?} is not a number in range")))
}

/// How deep lists, negations and variables may nest (Suricata's own rules nest four or five
/// levels: `!$HOME_NET`, a variable holding a list); a variable cycle stops here too.
const MAX_DEPTH: usize = 16;

/// The `[...]` items of a list, split at top-level commas.
fn list_items(s: &str) -> Result<Vec<&str>, Refusal> {
    let inner = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| bad(format!("{s:?}: a list is not closed")))?;
    let (mut depth, mut from, mut items) = (0i32, 0, Vec::new());
    for (i, c) in inner.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(inner[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(bad(format!("{s:?}: unbalanced brackets")));
        }
    }
    if depth != 0 {
        return Err(bad(format!("{s:?}: unbalanced brackets")));
    }
    items.push(inner[from..].trim());
    if items.iter().any(|i| i.is_empty()) {
        return Err(bad(format!("{s:?}: an empty list item")));
    }
    Ok(items)
}

fn var<'v>(s: &str, vars: &'v Vars, depth: usize) -> Result<Option<&'v str>, Refusal> {
    let Some(name) = s.strip_prefix('$') else {
        return Ok(None);
    };
    if depth >= MAX_DEPTH {
        return Err(bad(format!("${name}: variables nest too deep (a cycle?)")));
    }
    vars.0
        .get(name)
        .map(|v| Some(v.as_str()))
        .ok_or_else(|| bad(format!("variable ${name} is not defined")))
}

/// Refuses a list, negation or variable nested [`MAX_DEPTH`] deep: the parser and the matcher
/// recurse once per level.
fn nested(s: &str, depth: usize) -> Result<(), Refusal> {
    match depth > MAX_DEPTH {
        true => Err(bad(format!(
            "{:?}...: lists, negations and variables nest more than {MAX_DEPTH} deep",
            s.chars().take(24).collect::<String>()
        ))),
        false => Ok(()),
    }
}

fn addr(s: &str, vars: &Vars, depth: usize) -> Result<Addr, Refusal> {
    let s = s.trim();
    nested(s, depth)?;
    if let Some(v) = var(s, vars, depth)? {
        return addr(v, vars, depth + 1);
    }
    if let Some(rest) = s.strip_prefix('!') {
        let inner = addr(rest, vars, depth + 1)?;
        if inner == Addr::Any {
            return Err(bad(format!("{s:?} matches no address")));
        }
        return Ok(Addr::Not(Box::new(inner)));
    }
    if s == "any" {
        return Ok(Addr::Any);
    }
    if s.starts_with('[') {
        return list_items(s)?
            .into_iter()
            .map(|i| addr(i, vars, depth + 1))
            .collect::<Result<_, _>>()
            .map(Addr::List);
    }
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = a
        .parse()
        .map_err(|_| bad(format!("{s:?} is not an address, prefix, list or variable")))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u8 = match len {
        None => max,
        Some(l) => l
            .parse()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| bad(format!("{s:?}: prefix length must be 0 to {max}")))?,
    };
    // Host bits masked (Suricata accepts 10.1.2.3/8 as 10.0.0.0/8).
    IpNet::new(ip, len)
        .map(|n| Addr::Prefix(n.trunc()))
        .map_err(|e| bad(format!("{s:?}: {e}")))
}

fn port(s: &str, vars: &Vars, depth: usize) -> Result<Port, Refusal> {
    let s = s.trim();
    nested(s, depth)?;
    if let Some(v) = var(s, vars, depth)? {
        return port(v, vars, depth + 1);
    }
    if let Some(rest) = s.strip_prefix('!') {
        let inner = port(rest, vars, depth + 1)?;
        if inner == Port::Any {
            return Err(bad(format!("{s:?} matches no port")));
        }
        return Ok(Port::Not(Box::new(inner)));
    }
    if s == "any" {
        return Ok(Port::Any);
    }
    if s.starts_with('[') {
        return list_items(s)?
            .into_iter()
            .map(|i| port(i, vars, depth + 1))
            .collect::<Result<_, _>>()
            .map(Port::List);
    }
    let one = |p: &str| -> Result<u16, Refusal> {
        p.trim()
            .parse()
            .map_err(|_| bad(format!("{s:?} is not a port, range, list or variable")))
    };
    match s.split_once(':') {
        None => one(s).map(|p| Port::Range(p, p)),
        Some((a, b)) => {
            let lo = if a.is_empty() { 0 } else { one(a)? };
            let hi = if b.is_empty() { u16::MAX } else { one(b)? };
            if lo > hi {
                return Err(bad(format!("{s:?}: the range is empty")));
            }
            Ok(Port::Range(lo, hi))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(text: &str) -> Rule {
        let set = parse("t.rules", text, &Options::default()).unwrap();
        assert_eq!(set.rules.len(), 1);
        set.rules.into_iter().next().unwrap()
    }

    fn err(text: &str) -> RuleError {
        parse("t.rules", text, &Options::default()).unwrap_err()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_rule_with_every_supported_keyword() {
        let r = one(
            "alert tcp $EXTERNAL_NET any -> $HOME_NET $HTTP_PORTS (msg:\"dir \\\"traversal\\\"\\; x\"; \
             flow:to_server,established; content:\"GET \"; depth:4; offset:0; \
             content:\"|2e 2e|/\"; distance:0; within:64; nocase; fast_pattern; \
             content:!\"safe\"; classtype:web-application-attack; priority:2; \
             metadata:created_at 2024; reference:url,example.com; sid:1000001; rev:3;)",
        );
        assert_eq!(r.action, Action::Alert);
        assert_eq!(r.proto, Proto::Tcp);
        assert_eq!(r.msg, "dir \"traversal\"; x");
        assert_eq!((r.sid, r.rev, r.priority), (1000001, 3, Some(2)));
        assert_eq!(r.classtype.as_deref(), Some("web-application-attack"));
        assert!(r.flow.to_server && r.flow.established && !r.flow.to_client);
        assert_eq!(r.contents.len(), 3);
        assert_eq!(r.contents[0].pattern, b"GET ");
        assert_eq!(
            (r.contents[0].depth, r.contents[0].offset),
            (Some(4), Some(0))
        );
        assert_eq!(r.contents[1].pattern, b"../");
        assert_eq!(
            (r.contents[1].distance, r.contents[1].within),
            (Some(0), Some(64))
        );
        assert!(r.contents[1].nocase && r.contents[1].fast_pattern);
        assert!(r.contents[2].negated && r.contents[2].pattern == b"safe");
        // $EXTERNAL_NET is !$HOME_NET; $HTTP_PORTS is 80.
        assert!(r.header_matches(6, ip("203.0.113.9"), 40000, ip("10.1.2.3"), 80));
        assert!(!r.header_matches(6, ip("10.9.9.9"), 40000, ip("10.1.2.3"), 80));
        assert!(!r.header_matches(6, ip("203.0.113.9"), 40000, ip("10.1.2.3"), 81));
        assert!(!r.header_matches(17, ip("203.0.113.9"), 40000, ip("10.1.2.3"), 80));
    }

    #[test]
    fn addresses_and_ports_as_suricata_reads_them() {
        let r = one(
            "drop ip [10.0.0.0/8,![10.1.0.0/16,10.2.3.4]] [1024:,!5000:5010] <> 192.168.1.77/24 :1023 (sid:2;)",
        );
        assert_eq!(r.action, Action::Drop);
        assert!(r.bidirectional);
        let (inside, out) = (ip("192.168.1.5"), ip("10.9.0.1"));
        assert!(r.header_matches(6, out, 40000, inside, 22));
        assert!(
            r.header_matches(17, inside, 22, out, 40000),
            "<> matches the reverse"
        );
        assert!(
            !r.header_matches(6, ip("10.1.2.3"), 40000, inside, 22),
            "negated subnet"
        );
        assert!(
            !r.header_matches(6, ip("10.2.3.4"), 40000, inside, 22),
            "negated host"
        );
        assert!(
            !r.header_matches(6, out, 5005, inside, 22),
            "negated port range"
        );
        assert!(!r.header_matches(6, out, 80, inside, 22), "below 1024");
        assert!(!r.header_matches(6, out, 40000, inside, 2000), "above 1023");
        assert!(
            !r.header_matches(6, out, 40000, ip("192.168.2.5"), 22),
            "host bits masked: /24"
        );
        // A list of only negations is anything but them.
        let n = one("alert udp ![1.2.3.4,5.6.7.8] any -> any any (sid:3;)");
        assert!(n.header_matches(17, ip("9.9.9.9"), 1, ip("1.1.1.1"), 2));
        assert!(!n.header_matches(17, ip("5.6.7.8"), 1, ip("1.1.1.1"), 2));
        // IPv6.
        let v6 = one("alert tcp 2001:db8::/32 any -> any 443 (sid:4;)");
        assert!(v6.header_matches(6, ip("2001:db8::1"), 1, ip("::1"), 443));
        assert!(!v6.header_matches(6, ip("10.0.0.1"), 1, ip("::1"), 443));
    }

    #[test]
    fn continued_lines_comments_and_line_numbers() {
        let text = "# a comment\n\nalert tcp any any -> any any (msg:\"a\"; \\\n  content:\"x\"; sid:1;)\n\
                    alert udp any any -> any 53 (sid:2;)\n";
        let set = parse("t.rules", text, &Options::default()).unwrap();
        assert_eq!(
            set.rules
                .iter()
                .map(|r| (r.sid, r.line))
                .collect::<Vec<_>>(),
            [(1, 3), (2, 5)]
        );
    }

    #[test]
    fn unsupported_keywords_name_file_line_and_keyword_or_are_skipped() {
        let text = "alert tcp any any -> any any (sid:1;)\n\
                    alert http any any -> any any (sid:2;)\n\
                    alert tcp any any -> any any (pcre:\"/x/\"; sid:3;)\n";
        let e = err(text);
        assert_eq!(
            (e.file.as_str(), e.line, e.unsupported),
            ("t.rules", 2, true)
        );
        assert!(e.to_string().contains("t.rules:2: protocol `http`"), "{e}");
        let o = Options {
            skip_unsupported: true,
            ..Options::default()
        };
        let set = parse("t.rules", text, &o).unwrap();
        assert_eq!(set.rules.len(), 1);
        assert_eq!(set.skipped.len(), 2);
        assert!(
            set.skipped[1].reason.contains("keyword `pcre`"),
            "{:?}",
            set.skipped[1]
        );
    }

    #[test]
    fn nesting_is_bounded_not_a_stack_overflow() {
        let o = Options::default();
        // Deep enough for a real rule set's addresses...
        let fine = "alert tcp ![1.2.3.4,![5.6.7.8,[9.9.9.9]]] ![1,[2,![3]]] -> any any (sid:1;)";
        assert_eq!(parse("t.rules", fine, &o).unwrap().rules.len(), 1);
        // ...and a refusal, not a crash, for 30,000 levels of lists or negations.
        for deep in [
            format!("{}1.2.3.4{}", "[".repeat(30_000), "]".repeat(30_000)),
            format!("{}1.2.3.4", "!".repeat(30_000)),
        ] {
            let text = format!("alert tcp {deep} any -> any any (sid:1;)");
            let e = parse("t.rules", &text, &o).unwrap_err();
            assert!(e.to_string().contains("nest more than 16 deep"), "{e}");
            let text = format!(
                "alert tcp any {} -> any any (sid:1;)",
                deep.replace("1.2.3.4", "80")
            );
            let e = parse("t.rules", &text, &o).unwrap_err();
            assert!(e.to_string().contains("nest more than 16 deep"), "{e}");
        }
    }

    #[test]
    fn malformed_rules_are_errors_even_when_skipping() {
        let o = Options {
            skip_unsupported: true,
            ..Options::default()
        };
        for (text, what) in [
            ("alert tcp any any -> any any (msg:\"x\";)", "no `sid`"),
            ("alert tcp any any -> any any sid:1;", "no options"),
            ("alert tcp any any -> any (sid:1;)", "header has 6 fields"),
            ("alert tcp any any => any any (sid:1;)", "not a direction"),
            ("alert tcp any 99999 -> any any (sid:1;)", "not a port"),
            (
                "alert tcp 10.0.0.0/40 any -> any any (sid:1;)",
                "prefix length",
            ),
            (
                "alert tcp [10.0.0.1 any -> any any (sid:1;)",
                "brackets do not balance",
            ),
            (
                "alert tcp $NOPE any -> any any (sid:1;)",
                "$NOPE is not defined",
            ),
            ("alert tcp any 10:5 -> any any (sid:1;)", "range is empty"),
            (
                "alert tcp any any -> any any (content:\"|4g|\"; sid:1;)",
                "not hex",
            ),
            (
                "alert tcp any any -> any any (content:\"|41\"; sid:1;)",
                "not closed",
            ),
            (
                "alert tcp any any -> any any (content:\"abc; sid:1;)",
                "quote is not closed",
            ),
            (
                "alert tcp any any -> any any (nocase; sid:1;)",
                "must follow a `content`",
            ),
            (
                "alert tcp !any any -> any any (sid:1;)",
                "matches no address",
            ),
            (
                "alert tcp any any -> any any (content:\"a;b\"; sid:1;)",
                "quote is not closed",
            ),
            (
                "alert tcp any any -> any any (content:\"abc\"; depth:2; sid:1;)",
                "shorter",
            ),
            ("alert tcp any any -> any any (sid:x;)", "not a number"),
            (
                "alert tcp any any -> any any (sid:1)",
                "does not end with `;`",
            ),
            (
                "alert tcp any any -> any any (flow:to_server,to_client; sid:1;)",
                "match nothing",
            ),
            (
                "alert tcp any any -> any any (sid:1; \\\n",
                "nothing follows",
            ),
        ] {
            let e = parse("t.rules", text, &o).unwrap_err();
            assert!(e.reason.contains(what), "{text}: {e}");
            assert!(!e.unsupported, "{text}: {e}");
        }
        // Variables that refer to themselves stop.
        let mut vars = Vars::default();
        vars.set("A", "$B");
        vars.set("B", "$A");
        let o = Options {
            vars,
            ..Options::default()
        };
        let e = parse("t.rules", "alert tcp $A any -> any any (sid:1;)", &o).unwrap_err();
        assert!(e.reason.contains("too deep"), "{e}");
    }

    #[test]
    fn contents_match_as_suricata_inspects_them() {
        let m = |opts: &str, buf: &[u8]| {
            one(&format!("alert udp any any -> any any ({opts} sid:1;)")).payload_matches(buf)
        };
        assert!(m("", b"anything"), "no content");
        assert!(m("content:\"GET\";", b"xx GET /"));
        assert!(!m("content:\"GET\";", b"xx get /"));
        assert!(m("content:\"GET\"; nocase;", b"xx get /"));
        assert!(m("content:\"GET\"; depth:3;", b"GET /"));
        assert!(!m("content:\"GET\"; depth:3;", b" GET /"), "past depth");
        assert!(m("content:\"GET\"; offset:1; depth:3;", b" GET /"));
        assert!(!m("content:\"GET\"; offset:2;", b" GET /"), "before offset");
        // Relative: the second within 4 bytes after the first's end, after a distance.
        assert!(m(
            "content:\"a\"; content:\"b\"; distance:0; within:3;",
            b"a..b"
        ));
        assert!(!m(
            "content:\"a\"; content:\"b\"; distance:0; within:3;",
            b"a...b"
        ));
        assert!(m(
            "content:\"a\"; content:\"b\"; distance:2; within:2;",
            b"a..b"
        ));
        assert!(
            !m("content:\"a\"; content:\"b\"; distance:2;", b"ab"),
            "too close"
        );
        assert!(
            m(
                "content:\"ab\"; content:\"a\"; distance:-2; within:1;",
                b"ab"
            ),
            "back"
        );
        // Going back to a later occurrence of the first content.
        assert!(m("content:\"a\"; content:\"b\"; within:1;", b"a.ab"));
        // Relative on a first content: from the buffer's start.
        assert!(m("content:\"b\"; within:2;", b"ab"));
        assert!(!m("content:\"b\"; within:2;", b"aab"));
        // Negated: nowhere in its window; the position stays.
        assert!(m(
            "content:\"a\"; content:!\"x\"; distance:0; within:2;",
            b"a.bx"
        ));
        assert!(!m(
            "content:\"a\"; content:!\"x\"; distance:0; within:2;",
            b"a.x"
        ));
        assert!(m("content:!\"evil\";", b"good"));
        assert!(!m("content:!\"evil\";", b"so evil"));
        assert!(m(
            "content:\"|00 01|\"; content:\"|ff|\"; distance:1;",
            b"\x00\x01?\xff"
        ));
    }

    /// Suricata's semantics written as a predicate over one position per content (a negated
    /// content has none), tried for every assignment: the oracle of the backtracking search.
    fn brute(contents: &[Content], buf: &[u8], prev_end: usize) -> bool {
        let Some((c, rest)) = contents.split_first() else {
            return true;
        };
        let fits = |p: usize| {
            let end = p + c.pattern.len();
            if end > buf.len() || !occurs_at(c, buf, p) {
                return false;
            }
            if c.distance.is_some() || c.within.is_some() {
                let base = prev_end as i64 + i64::from(c.distance.unwrap_or(0));
                p as i64 >= base.max(0)
                    && c.within.is_none_or(|w| end as i64 <= base + i64::from(w))
            } else {
                let off = c.offset.unwrap_or(0) as usize;
                p >= off && c.depth.is_none_or(|d| end <= off + d as usize)
            }
        };
        if c.negated {
            return !(0..=buf.len()).any(fits) && brute(rest, buf, prev_end);
        }
        (0..=buf.len()).any(|p| fits(p) && brute(rest, buf, p + c.pattern.len()))
    }

    fn content_strategy() -> impl Strategy<Value = Content> {
        (
            proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'A')], 1..3),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u32..4),
            proptest::option::of(1u32..6),
            proptest::option::of(-2i32..4),
            proptest::option::of(1u32..6),
            any::<bool>(),
        )
            .prop_map(
                |(pattern, negated, nocase, offset, depth, distance, within, rel)| {
                    let n = pattern.len() as u32;
                    let (offset, depth, distance, within) = if rel {
                        (None, None, distance, within.map(|w| w.max(n)))
                    } else {
                        (offset, depth.map(|d| d.max(n)), None, None)
                    };
                    Content {
                        pattern,
                        negated,
                        nocase,
                        offset,
                        depth,
                        distance,
                        within,
                        fast_pattern: false,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn the_search_agrees_with_the_brute_force_oracle(
            contents in proptest::collection::vec(content_strategy(), 0..4),
            buf in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'A'), Just(b'.')], 0..12),
        ) {
            let mut budget = MATCH_BUDGET;
            prop_assert_eq!(contents_match(&contents, &buf, 0, &mut budget), brute(&contents, &buf, 0));
        }

        #[test]
        fn no_input_makes_the_parser_panic(text in "\\PC{0,200}") {
            let _ = parse("f.rules", &text, &Options::default());
        }

        #[test]
        fn no_rule_shaped_input_makes_it_panic(
            header in "(alert|drop|pass) (tcp|udp|ip|http) [\\[\\]!$a-z0-9.,/:]{1,20} [\\[\\]!a-z0-9:,]{1,12} (->|<>) any any",
            body in "[a-z_:;\"|!0-9a-f \\\\]{0,60}",
        ) {
            let _ = parse("f.rules", &format!("{header} ({body})"), &Options::default());
        }
    }
}
