//! flowstate's configuration vocabulary: what every section of a deployment file (the
//! runtime's, each NF's, the fast path's, the cluster's, the drivers') means by a duration,
//! a prefix and a key, so that one spelling works everywhere and every error reads alike.
//!
//! Promises:
//! * **Durations** are [`humantime`] strings: `"30s"`, `"2h4m"`, `"1ms"`, `"250us"`,
//!   `"0.5s"`. A bare number is refused with a message that suggests the string
//!   (`write a duration with its unit, e.g. "300s"`): a unit-less number meant seconds in
//!   some sections and milliseconds in others before, and a silent guess would be wrong in
//!   one of them.
//! * **Prefixes** are [`ipnet`]'s. A bare address is the prefix of that one address. A prefix
//!   with host bits set is refused, naming the network it probably meant
//!   (`10.0.0.1/24: host bits set; did you mean 10.0.0.0/24?`), as `ip route` and nftables
//!   do. The data path matches addresses against them as they are ([`PrefixMatch`]: a mask
//!   and a compare, inlined); only forms shaped for a table's key or the hardware (the fast
//!   path's IPv4 LPM key and its XDP mirror) are converted at configuration time.
//! * [`deserialize_all`] reads a table into a serde type and reports **every** key that does
//!   not read (unknown, wrong type, bad value), each with its dotted path, not only the first.
//! * [`line_of`] finds the line of a dotted key (`chain[1].udp`,
//!   `fastpath.table[0].rules[2].key`) in a file's text, so that an error found after
//!   parsing still names its line.
//!
//! This crate depends on nothing of flowstate's (like `flowstate-wire`): every crate that
//! reads configuration may use it.

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

pub use ipnet::{IpNet, Ipv4Net, Ipv6Net};

// ---------------------------------------------------------------------------------------------
// Secrets

/// A password or token: compared and cloned, never printed (`Debug` shows `***`), so that a
/// setting logged or shown in an error does not give it away.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `s`.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

// ---------------------------------------------------------------------------------------------
// Files

/// The most bytes flowstate reads of any file it is given (a deployment, a rule set, a key or
/// secret file): 64 MiB, above the largest public rule sets.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The text of the file at `path`, refused (`InvalidData`) when it holds more than
/// [`MAX_FILE_BYTES`] (`/dev/zero` given as a rule file ends here, not in memory exhaustion).
pub fn read_text(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB, the most read of a file",
                MAX_FILE_BYTES >> 20
            ),
        ));
    }
    Ok(text)
}

// ---------------------------------------------------------------------------------------------
// Durations

/// The message for a number given where a duration is expected: the same number as seconds,
/// written with its unit.
pub fn unit_needed(n: impl fmt::Display) -> String {
    unit_needed_in(n, "s")
}

/// [`unit_needed`] for a key whose bare numbers meant `unit` before (`"ms"`).
pub fn unit_needed_in(n: impl fmt::Display, unit: &str) -> String {
    format!("write a duration with its unit, e.g. \"{n}{unit}\"")
}

/// Whether `s` is a number without a unit (`"300"`, `"0.5"`).
pub fn is_bare_number(s: &str) -> bool {
    let t = s.trim();
    !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// The longest duration any key takes: 100 years. Every timer adds durations to a monotonic
/// clock or multiplies them by a small count; bounded here, none of that can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Parses a duration: a number and a unit, several of them summed (`"30s"`, `"2h4m"`,
/// `"1ms"`, `"250us"`, `"1.5s"`; units ns, us/µs, ms, s, m/min, h, d, and
/// [`humantime`]'s longer spellings), at most [`MAX_DURATION`]. A number without a unit is an
/// error suggesting one.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if is_bare_number(t) {
        return Err(unit_needed(t));
    }
    let d = humantime::parse_duration(t).map_err(|e| {
        format!(
            "{s:?} is not a duration ({e}); expected a number and a unit, like \"30s\", \"2h4m\", \"1ms\" or \"250us\""
        )
    })?;
    if d > MAX_DURATION {
        return Err(format!(
            "{s:?} is longer than the longest duration taken ({})",
            format_duration(MAX_DURATION)
        ));
    }
    Ok(d)
}

/// `d` as [`parse_duration`] reads it back (`"1ms"`, `"2h 4m"`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A duration from a TOML value: a string as [`parse_duration`] reads it; a number is an
/// error suggesting the string.
pub fn duration_value(v: &toml::Value) -> Result<Duration, String> {
    match v {
        toml::Value::String(s) => parse_duration(s),
        toml::Value::Integer(n) => Err(unit_needed(n)),
        toml::Value::Float(x) => Err(unit_needed(x)),
        other => Err(format!(
            "expected a duration like \"30s\", got {}",
            other.type_str()
        )),
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration like \"30s\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        parse_duration(s).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        Err(E::custom(unit_needed(n)))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        Err(E::custom(unit_needed(n)))
    }

    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Duration, E> {
        Err(E::custom(unit_needed(x)))
    }
}

/// `#[serde(deserialize_with = "flowstate_config::deserialize_duration")]`: a
/// [`parse_duration`] string.
pub fn deserialize_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor)
}

/// `#[serde(default, deserialize_with = "flowstate_config::deserialize_opt_duration")]`: an
/// optional [`parse_duration`] string.
pub fn deserialize_opt_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    deserialize_duration(d).map(Some)
}

// ---------------------------------------------------------------------------------------------
// Prefixes

/// Parses a prefix, `"10.0.0.0/8"`, `"fd00::/8"`, or a bare address (the prefix of that one
/// address). Host bits set are an error naming the network probably meant.
pub fn parse_prefix(s: &str) -> Result<IpNet, String> {
    let t = s.trim();
    let expected = || format!("{s:?} is not an IP prefix like \"10.0.0.0/8\" or \"fd00::/8\"");
    let (addr, len) = match t.split_once('/') {
        None => {
            let addr: IpAddr = t.parse().map_err(|_| expected())?;
            return Ok(IpNet::from(addr));
        }
        Some((a, l)) => (a, l),
    };
    let addr: IpAddr = addr.parse().map_err(|_| expected())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = len
        .parse::<u8>()
        .ok()
        .filter(|l| *l <= max)
        .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?;
    let net = IpNet::new(addr, len).map_err(|_| expected())?;
    if net.addr() != net.network() {
        return Err(format!("{t}: host bits set; did you mean {}?", net.trunc()));
    }
    Ok(net)
}

/// [`parse_prefix`], IPv4 only.
pub fn parse_prefix_v4(s: &str) -> Result<Ipv4Net, String> {
    match parse_prefix(s)? {
        IpNet::V4(n) => Ok(n),
        IpNet::V6(_) => Err(format!(
            "{s:?} is an IPv6 prefix; expected an IPv4 one like \"10.0.0.0/8\""
        )),
    }
}

/// [`parse_prefix`], IPv6 only.
pub fn parse_prefix_v6(s: &str) -> Result<Ipv6Net, String> {
    match parse_prefix(s)? {
        IpNet::V6(n) => Ok(n),
        IpNet::V4(_) => Err(format!(
            "{s:?} is an IPv4 prefix; expected an IPv6 one like \"fd00::/8\""
        )),
    }
}

/// Matching an address against a prefix on the data path. ipnet's own `contains` compares
/// against the network and broadcast addresses through calls that are not `#[inline]`; this
/// is one mask and one compare, inlined into the caller.
pub trait PrefixMatch {
    /// Whether `ip` lies in the prefix (host bits of the prefix ignored); an address of the
    /// other family never does.
    fn matches(&self, ip: &IpAddr) -> bool;
}

impl PrefixMatch for IpNet {
    #[inline]
    fn matches(&self, ip: &IpAddr) -> bool {
        match (self, ip) {
            (IpNet::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(n.prefix_len()))
                    .unwrap_or(0);
                (u32::from(*a) ^ u32::from(n.addr())) & mask == 0
            }
            (IpNet::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(n.prefix_len()))
                    .unwrap_or(0);
                (u128::from(*a) ^ u128::from(n.addr())) & mask == 0
            }
            _ => false,
        }
    }
}

/// `#[serde(deserialize_with = "flowstate_config::deserialize_prefix")]`: a
/// [`parse_prefix`] string.
pub fn deserialize_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<IpNet, D::Error> {
    let s = String::deserialize(d)?;
    parse_prefix(&s).map_err(de::Error::custom)
}

/// `#[serde(default, deserialize_with = "flowstate_config::deserialize_opt_prefix")]`.
pub fn deserialize_opt_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpNet>, D::Error> {
    deserialize_prefix(d).map(Some)
}

// ---------------------------------------------------------------------------------------------
// Tables and keys

/// One thing wrong in a table: the dotted key (relative to the table read) and what is
/// wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key, dotted, with indices: `udp`, `timeouts.udp`, `rules[2].src`.
    pub key: String,
    /// What is wrong and what was expected.
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// Reads `table` as a `T` (a struct with `deny_unknown_fields`), reporting every key that
/// does not read: each error's key is dropped and the rest read again, until the rest reads
/// or an error names no key of the table (a missing field, reported last).
pub fn deserialize_all<T: DeserializeOwned>(table: &toml::Table) -> Result<T, Vec<Problem>> {
    let mut rest = table.clone();
    let mut problems = Vec::new();
    // Keys dropped for their errors: their absence is no further error.
    let mut dropped: Vec<String> = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, T>(toml::Value::Table(rest.clone())) {
            Ok(v) if problems.is_empty() => return Ok(v),
            Ok(_) => return Err(problems),
            Err(e) => {
                let path = e.path().to_string();
                let message = e.inner().message().trim().to_owned();
                let mut key = if path == "." { String::new() } else { path };
                // An unknown key is reported by its table: name the key itself.
                if let Some(name) = backquoted(&message, "unknown field `") {
                    // (Some deserializers' paths end with the unknown key, some do not.)
                    if key.rsplit('.').next() != Some(name) {
                        if !key.is_empty() {
                            key.push('.');
                        }
                        key.push_str(name);
                    }
                } else if let Some(name) = backquoted(&message, "missing field `") {
                    if !key.is_empty() {
                        key.push('.');
                    }
                    key.push_str(name);
                }
                if dropped.contains(&key) {
                    return Err(problems);
                }
                let top = top_key(&key).to_owned();
                problems.push(Problem {
                    key,
                    reason: message,
                });
                if top.is_empty() || rest.remove(&top).is_none() {
                    return Err(problems);
                }
                dropped.push(top);
            }
        }
    }
}

/// The name between `` ` `` marks after `prefix`, when `message` starts with `prefix`.
fn backquoted<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    message.strip_prefix(prefix)?.split('`').next()
}

/// The first segment of a dotted key: `rules` of `rules[2].src`.
fn top_key(key: &str) -> &str {
    key.split(['.', '[']).next().unwrap_or("")
}

/// The line (1-based) of the dotted `key` (`runtime.workers`, `chain[1].udp`,
/// `fastpath.table[0].rules[2].key`) in the TOML `text`: the line of the deepest part of the
/// key the text holds (the entry, when the key itself is missing from it). `None` when the
/// text does not parse or holds not even the key's first part.
pub fn line_of(text: &str, key: &str) -> Option<usize> {
    use toml_edit::{Item, Value};
    let doc = toml_edit::Document::parse(text).ok()?;
    enum Node<'a> {
        Table(&'a dyn toml_edit::TableLike),
        Item(&'a Item),
        Value(&'a Value),
    }
    let mut node = Node::Table(doc.as_table());
    let mut found: Option<usize> = None;
    for segment in key.split('.') {
        let (name, indices) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        let table: &dyn toml_edit::TableLike = match node {
            Node::Table(t) => t,
            Node::Item(i) => match i.as_table_like() {
                Some(t) => t,
                None => break,
            },
            Node::Value(Value::InlineTable(t)) => t,
            Node::Value(_) => break,
        };
        let Some((k, item)) = table.get_key_value(name) else {
            break;
        };
        found = k.span().or_else(|| item.span()).map(|s| s.start).or(found);
        node = Node::Item(item);
        for index in indices
            .split(['[', ']'])
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<usize>())
        {
            let Ok(index) = index else { break };
            let next = match node {
                Node::Item(Item::ArrayOfTables(a)) => a.get(index).map(|t| {
                    found = t.span().map(|s| s.start).or(found);
                    Node::Table(t as &dyn toml_edit::TableLike)
                }),
                Node::Item(Item::Value(Value::Array(a))) | Node::Value(Value::Array(a)) => {
                    a.get(index).map(|v| {
                        found = v.span().map(|s| s.start).or(found);
                        Node::Value(v)
                    })
                }
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => return found.map(|p| line_at(text, p)),
            }
        }
    }
    found.map(|p| line_at(text, p))
}

/// The line (1-based) of byte `pos` of `text`.
pub fn line_at(text: &str, pos: usize) -> usize {
    let pos = pos.min(text.len());
    text.as_bytes()[..pos]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_units() {
        let ok = [
            ("30s", Duration::from_secs(30)),
            ("2h4m", Duration::from_secs(2 * 3600 + 4 * 60)),
            ("2h 4m", Duration::from_secs(2 * 3600 + 4 * 60)),
            ("1ms", Duration::from_millis(1)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            (" 7ns ", Duration::from_nanos(7)),
            ("0.5s", Duration::from_millis(500)),
            ("0s", Duration::ZERO),
            ("1d", Duration::from_secs(86_400)),
        ];
        for (s, d) in ok {
            assert_eq!(parse_duration(s), Ok(d), "{s}");
        }
        assert_eq!(
            parse_duration("300").unwrap_err(),
            "write a duration with its unit, e.g. \"300s\""
        );
        for bad in ["", "ms", "1 parsec", "-1ms", "1..2ms", "soon", "0"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        for d in [
            Duration::from_micros(250),
            Duration::from_secs(7440),
            Duration::ZERO,
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn a_duration_longer_than_the_longest_taken_is_refused() {
        assert_eq!(parse_duration("36500d"), Ok(MAX_DURATION));
        assert_eq!(
            parse_duration(&format_duration(MAX_DURATION)),
            Ok(MAX_DURATION)
        );
        for long in ["36501d", "101y", "584542046090y"] {
            let e = parse_duration(long).unwrap_err();
            assert!(
                e.contains("longer than the longest duration taken"),
                "{long}: {e}"
            );
        }
        // Bounded, a duration added to now or multiplied by a count of beats cannot overflow.
        let now = std::time::Instant::now();
        assert!(now.checked_add(MAX_DURATION * 1000).is_some());
    }

    #[test]
    fn a_number_for_a_duration_suggests_the_string() {
        let v = |s: &str| toml::from_str::<toml::Table>(&format!("x = {s}")).unwrap()["x"].clone();
        assert_eq!(
            duration_value(&v("300")).unwrap_err(),
            "write a duration with its unit, e.g. \"300s\""
        );
        assert_eq!(
            duration_value(&v("0.5")).unwrap_err(),
            "write a duration with its unit, e.g. \"0.5s\""
        );
        assert!(duration_value(&v("true")).unwrap_err().contains("boolean"));
        assert_eq!(duration_value(&v("\"2m\"")), Ok(Duration::from_secs(120)));

        #[derive(Deserialize, Debug)]
        struct T {
            #[serde(deserialize_with = "deserialize_duration")]
            udp: Duration,
        }
        let e = toml::from_str::<T>("udp = 30").unwrap_err();
        assert!(
            e.message()
                .contains("write a duration with its unit, e.g. \"30s\""),
            "{e}"
        );
        assert_eq!(
            toml::from_str::<T>("udp = \"30s\"").unwrap().udp,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn prefixes_refuse_host_bits() {
        assert_eq!(
            parse_prefix("10.0.0.0/8").unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(parse_prefix("fd00::/8").unwrap().to_string(), "fd00::/8");
        assert_eq!(
            parse_prefix("192.0.2.7").unwrap().to_string(),
            "192.0.2.7/32"
        );
        assert_eq!(parse_prefix("::1").unwrap().to_string(), "::1/128");
        assert_eq!(
            parse_prefix("10.0.0.1/24").unwrap_err(),
            "10.0.0.1/24: host bits set; did you mean 10.0.0.0/24?"
        );
        assert_eq!(
            parse_prefix("fd00::1/8").unwrap_err(),
            "fd00::1/8: host bits set; did you mean fd00::/8?"
        );
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "x/8",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "fd00::/129",
            "banana",
        ] {
            assert!(parse_prefix(bad).is_err(), "{bad}");
        }
        assert!(parse_prefix_v4("fd00::/8").is_err());
        assert!(parse_prefix_v6("10.0.0.0/8").is_err());
        assert_eq!(parse_prefix_v4("0.0.0.0/0").unwrap().prefix_len(), 0);
    }

    #[test]
    fn prefixes_match_addresses_of_their_family() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = parse_prefix("10.0.0.0/8").unwrap();
        assert!(p.matches(&ip("10.255.0.1")));
        assert!(!p.matches(&ip("11.0.0.1")));
        assert!(!p.matches(&ip("::1")));
        let h = parse_prefix("192.0.2.7").unwrap();
        assert_eq!(h.prefix_len(), 32);
        assert!(h.matches(&ip("192.0.2.7")));
        assert!(!h.matches(&ip("192.0.2.8")));
        let all = parse_prefix("0.0.0.0/0").unwrap();
        assert!(all.matches(&ip("1.2.3.4")));
        assert!(!all.matches(&ip("::")));
        let v6 = parse_prefix("fd00::/8").unwrap();
        assert!(v6.matches(&ip("fdab::1")));
        assert!(!v6.matches(&ip("fe00::1")));
        assert!(parse_prefix("::/0").unwrap().matches(&ip("2001:db8::1")));
        assert_eq!(
            parse_prefix("10.1.2.3/8").unwrap_err(),
            "10.1.2.3/8: host bits set; did you mean 10.0.0.0/8?"
        );
        // A prefix made with host bits matches as its network does.
        let loose = IpNet::new(ip("10.1.2.3"), 8).unwrap();
        assert_eq!(loose.trunc().to_string(), "10.0.0.0/8");
        assert!(loose.matches(&ip("10.200.0.1")));
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nf {
        external: Vec<String>,
        #[serde(default, deserialize_with = "deserialize_opt_duration")]
        udp: Option<Duration>,
        #[serde(default)]
        timeouts: Timeouts,
        #[serde(default)]
        rules: Vec<Rule>,
    }

    #[derive(Deserialize, Debug, Default)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Timeouts {
        #[serde(default, deserialize_with = "deserialize_opt_duration")]
        tcp: Option<Duration>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Rule {
        #[serde(default, deserialize_with = "deserialize_opt_prefix")]
        src: Option<IpNet>,
    }

    #[test]
    fn every_bad_key_of_a_table_is_reported() {
        let t: toml::Table = toml::from_str(
            "external = [\"a\"]\nudp = 30\ncolour = 1\ntimeouts = { tcp = 5, tpc = \"1s\" }\nrules = [{ src = \"10.0.0.0/8\" }, { src = \"10.0.0.1/8\" }]\n",
        )
        .unwrap();
        let problems = deserialize_all::<Nf>(&t).unwrap_err();
        let mut keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["colour", "rules[1].src", "timeouts.tcp", "udp"],
            "{problems:?}"
        );
        let udp = problems.iter().find(|p| p.key == "udp").unwrap();
        assert!(udp.reason.contains("\"30s\""), "{udp}");
        let src = problems.iter().find(|p| p.key == "rules[1].src").unwrap();
        assert!(src.reason.contains("did you mean 10.0.0.0/8?"), "{src}");

        let t: toml::Table = toml::from_str("udp = \"1s\"").unwrap();
        let problems = deserialize_all::<Nf>(&t).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "external");
        let t: toml::Table = toml::from_str("external = []\nudp = \"1s\"").unwrap();
        assert!(deserialize_all::<Nf>(&t).is_ok());
        // A required key dropped for its error is not reported missing too.
        let t: toml::Table = toml::from_str("external = [1]").unwrap();
        let problems = deserialize_all::<Nf>(&t).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "external[0]");
    }

    #[test]
    fn lines_of_keys() {
        let text = "[input]\nsynthetic = { profile = \"m\", flows = 3 }\n\n[[chain]]\nnf = \"a\"\n[[chain]]\nnf = \"nat\"\nudp = 30\nrules = [\n  { src = \"x\" },\n  { src = \"y\" },\n]\n[fastpath]\n[[fastpath.table]]\nname = \"t\"\n";
        assert_eq!(line_of(text, "input"), Some(1));
        assert_eq!(line_of(text, "input.synthetic.flows"), Some(2));
        assert_eq!(line_of(text, "chain[0].nf"), Some(5));
        assert_eq!(line_of(text, "chain[1].udp"), Some(8));
        assert_eq!(line_of(text, "chain[1].rules[1].src"), Some(11));
        assert_eq!(line_of(text, "chain[1].rules[1]"), Some(11));
        // The deepest part the text holds: the entry of a missing key.
        assert_eq!(line_of(text, "chain[1].external"), Some(6));
        assert_eq!(line_of(text, "fastpath.table[0].name"), Some(15));
        assert_eq!(line_of(text, "runtime.workers"), None);
        assert_eq!(line_of("x = ", "x"), None);
    }

    mod never_panics {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn parsers_on_any_text(s in "\\PC{0,40}") {
                let _ = parse_duration(&s);
                let _ = parse_prefix(&s);
            }

            #[test]
            fn line_of_any_key(key in "[a-z\\[\\]0-9.]{0,20}") {
                let text = "[input]\nsynthetic = { flows = 3 }\n[[chain]]\nnf = \"a\"\nr = [{ a = 1 }]\n";
                if let Some(l) = line_of(text, &key) {
                    prop_assert!((1..=5).contains(&l));
                }
            }

            #[test]
            fn matches_agrees_with_ipnet(a in any::<u32>(), b in any::<u32>(), len in 0u8..=32,
                                         a6 in any::<u128>(), b6 in any::<u128>(), len6 in 0u8..=128) {
                let net = IpNet::from(Ipv4Net::new(a.into(), len).unwrap());
                for ip in [IpAddr::from(std::net::Ipv4Addr::from(b)), IpAddr::from(std::net::Ipv4Addr::from(a))] {
                    prop_assert_eq!(net.matches(&ip), net.contains(&ip));
                }
                let net6 = IpNet::from(Ipv6Net::new(a6.into(), len6).unwrap());
                for ip in [IpAddr::from(std::net::Ipv6Addr::from(b6)), IpAddr::from(std::net::Ipv6Addr::from(a6))] {
                    prop_assert_eq!(net6.matches(&ip), net6.contains(&ip));
                }
                prop_assert!(!net.matches(&IpAddr::from(std::net::Ipv6Addr::from(b6))));
            }

            #[test]
            fn a_printed_prefix_reads_back(a in any::<u32>(), len in 0u8..=32) {
                let net = Ipv4Net::new(a.into(), len).unwrap().trunc();
                prop_assert_eq!(parse_prefix_v4(&net.to_string()), Ok(net));
            }
        }
    }
}
