//! The pipeline from TOML: a `[fastpath]` section and its `[[fastpath.table]]`s.
//!
//! ```toml
//! [fastpath]
//! mode = "lazy"                 # "busy" | "lazy" | "lazy-p"
//! threads = 4                   # slow-path threads searching in parallel (lazy-p)
//! recirculation = "fs-rc"       # live box: the veth pair made for answers (and "fs-rc-tx")
//!
//! [[fastpath.table]]
//! name = "acl"
//! kind = "exact"                # or "lpm"
//! key = ["proto", "dst_port"]   # src_ip dst_ip src_port dst_port proto mark egress
//! cache = 1024                  # fast-path entries (0: every lookup to the slow path)
//! writes = ["mark"]             # fields its rules may write
//! branches = ["web", "route"]   # next table per rule's branch ("end" ends the pipeline)
//! bloom = { bits = 4096 }       # 2D Bloom branch selector (filters, weight, bits, hashes)
//! default = { branch = "route" } # an absent key: { set = {..}, drop = .., branch = .. }
//! rules = [ { key = "6,80", set = { mark = 1 }, branch = "web" } ]
//!
//! [[fastpath.table]]
//! name = "route"
//! kind = "lpm"
//! key = ["dst_ip"]
//! prefixes = "routes.tsv"       # "a.b.c.d/len<TAB>label" per line, egress by label
//! next_hops = 4                 # egress = 1 + hash(label) % next_hops
//! ```
//!
//! A balancing table (`balance = ["10.0.0.1:80", ...]`) admits new flows on the slow path.
//! Relative paths are relative to the current directory, as in the rest of flowstate's
//! configuration. Every error names its key.

use crate::bloom::BloomParams;
use crate::cache::Prefix;
use crate::fast::Mode;
use crate::headers::{Field, Fields, Rule};
use crate::table::{Kind, Next, OnMiss, Pipeline, Table};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

/// A bad `[fastpath]` section.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{}: {key}: {reason}", file.display())]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// The key, dotted (`fastpath.table[2].rules[5].key`).
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

/// One table's rules: key (an LPM rule's is [`Prefix::key`]) and rule.
pub type TableRules = Vec<(u128, Rule)>;

/// A pipeline ready to load: its tables, their rules, and how misses are submitted.
#[derive(Clone, Debug)]
pub struct FastpathConfig {
    /// The tables.
    pub pipeline: Pipeline,
    /// Per table, its inline rules (an LPM rule's key is [`Prefix::key`]); see
    /// [`FastpathConfig::load_rules`] for all of them.
    pub rules: Vec<TableRules>,
    /// Per table, the file of prefixes it reads (`prefixes = "FILE"`), read at start.
    pub prefix_files: Vec<Option<PrefixFile>>,
    /// The submit mode.
    pub mode: Mode,
    /// Slow-path threads (lazy-p searches this many tables at once).
    pub threads: usize,
    /// On a live box, the name of the veth pair made for the slow path's answers: the
    /// program reads circulation headers on this end, the slow path sends from its peer,
    /// named with `-tx` appended.
    pub recirculation: String,
}

/// The recirculation port's name by default.
pub const RECIRCULATION: &str = "fs-rc";

/// An LPM table's prefixes from a file: `a.b.c.d/len<TAB>label` per line, the next hop (the
/// egress port, 1..=`next_hops`) chosen by a hash of the label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixFile {
    /// The file, relative to the current directory.
    pub path: PathBuf,
    /// Next hops to spread the labels over.
    pub next_hops: u16,
}

impl FastpathConfig {
    /// Every table's rules: the inline ones, then those its prefix file holds. The error is
    /// the dotted key and the reason (the file, and the line that is wrong).
    pub fn load_rules(&self) -> Result<Vec<TableRules>, (String, String)> {
        let mut all = self.rules.clone();
        for (i, file) in self.prefix_files.iter().enumerate() {
            let Some(PrefixFile { path, next_hops }) = file else {
                continue;
            };
            let key = format!("fastpath.table[{i}].prefixes");
            let text = flowstate_config::read_text(path)
                .map_err(|e| (key.clone(), format!("{}: {e}", path.display())))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (p, label) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
                let p = prefix(p)
                    .map_err(|e| (key.clone(), format!("{}:{}: {e}", path.display(), n + 1)))?;
                let hop = 1 + (label_hash(label.trim()) % u64::from(*next_hops)) as u32;
                all[i].push((p.key(), Rule::set(Field::Egress, hop)));
            }
            if all[i].len() > MAX_RULES {
                return Err((key, format!("more than {MAX_RULES} rules")));
            }
        }
        Ok(all)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    threads: Option<usize>,
    #[serde(default)]
    recirculation: Option<String>,
    #[serde(default)]
    table: Vec<TableToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TableToml {
    name: String,
    kind: String,
    key: Vec<String>,
    #[serde(default = "default_cache")]
    cache: usize,
    #[serde(default)]
    writes: Vec<String>,
    #[serde(default)]
    branches: Vec<String>,
    #[serde(default)]
    bloom: Option<BloomToml>,
    #[serde(default)]
    default: Option<RuleToml>,
    #[serde(default)]
    rules: Vec<RuleToml>,
    #[serde(default)]
    prefixes: Option<String>,
    #[serde(default)]
    next_hops: Option<u16>,
    #[serde(default)]
    balance: Vec<String>,
}

fn default_cache() -> usize {
    1024
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BloomToml {
    filters: Option<u8>,
    weight: Option<u8>,
    bits: Option<usize>,
    hashes: Option<u8>,
    fp: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RuleToml {
    #[serde(default)]
    key: Option<toml::Value>,
    #[serde(default)]
    set: BTreeMap<String, toml::Value>,
    #[serde(default)]
    drop: bool,
    #[serde(default)]
    branch: Option<String>,
}

/// Most rules a configuration may hold per table (a limit on memory, not on the design).
pub const MAX_RULES: usize = 4_000_000;

impl FastpathConfig {
    /// Reads the `[fastpath]` section of the TOML file `file`.
    pub fn from_file(file: &Path) -> Result<FastpathConfig, ConfigError> {
        let text = flowstate_config::read_text(file).map_err(|e| ConfigError {
            file: file.to_owned(),
            key: String::new(),
            reason: format!("cannot read: {e}"),
        })?;
        let value: toml::Table = toml::from_str(&text).map_err(|e| ConfigError {
            file: file.to_owned(),
            key: String::new(),
            reason: format!("not TOML: {}", e.message()),
        })?;
        let Some(section) = value.get("fastpath") else {
            return Err(ConfigError {
                file: file.to_owned(),
                key: "fastpath".into(),
                reason: "missing: a [fastpath] section with [[fastpath.table]]s".into(),
            });
        };
        FastpathConfig::from_value(section.clone()).map_err(|mut e| {
            let (key, reason) = e.remove(0);
            ConfigError {
                file: file.to_owned(),
                key,
                reason,
            }
        })
    }

    /// Builds the pipeline from the `[fastpath]` value (files it names are read by
    /// [`load_rules`](Self::load_rules)). Each error is the dotted key and the reason; every
    /// table's first is reported.
    pub fn from_value(v: toml::Value) -> Result<FastpathConfig, Vec<(String, String)>> {
        // Each table on its own, so that an error names the table it is in.
        let mut v = v;
        let tables = match v.as_table_mut().and_then(|t| t.remove("table")) {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => a,
            Some(other) => {
                return Err(vec![(
                    "fastpath.table".into(),
                    format!("expected [[fastpath.table]]s, got {}", other.type_str()),
                )])
            }
        };
        let mut errors = Vec::new();
        let mut s: Section = match v.try_into() {
            Ok(s) => s,
            Err(e) => {
                let e: toml::de::Error = e;
                return Err(vec![("fastpath".to_owned(), e.message().to_owned())]);
            }
        };
        for (i, t) in tables.into_iter().enumerate() {
            match t.try_into() {
                Ok(t) => s.table.push(t),
                Err(e) => {
                    let e: toml::de::Error = e;
                    errors.push((format!("fastpath.table[{i}]"), e.message().to_owned()));
                }
            }
        }
        let mode = match s.mode.as_deref() {
            None => Mode::Lazy,
            Some(m) => Mode::parse(m).unwrap_or_else(|| {
                errors.push((
                    "fastpath.mode".to_owned(),
                    format!("{m:?}: expected \"busy\", \"lazy\" or \"lazy-p\""),
                ));
                Mode::Lazy
            }),
        };
        let threads = s.threads.unwrap_or(4);
        if threads == 0 || threads > 64 {
            errors.push((
                "fastpath.threads".into(),
                format!("{threads}: expected 1..=64"),
            ));
        }
        let recirculation = s.recirculation.unwrap_or_else(|| RECIRCULATION.into());
        // An interface name, with room for "-tx" (IFNAMSIZ: 15 bytes and a NUL).
        if recirculation.is_empty()
            || recirculation.len() > 12
            || !recirculation
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            errors.push((
                "fastpath.recirculation".into(),
                format!("{recirculation:?}: expected an interface name of 1 to 12 letters, digits, '-' or '_'"),
            ));
        }
        if s.table.is_empty() && errors.is_empty() {
            errors.push(("fastpath.table".into(), "no table".into()));
        }
        if !errors.is_empty() {
            // A table that did not read would make the others' branches look wrong.
            return Err(errors);
        }
        let names: Vec<&str> = s.table.iter().map(|t| t.name.as_str()).collect();
        let mut pipeline = Pipeline::default();
        let mut rules = Vec::new();
        let mut prefix_files = Vec::new();
        for (i, t) in s.table.iter().enumerate() {
            match table(i, t, &names) {
                Ok((table, table_rules, prefix_file)) => {
                    pipeline.tables.push(table);
                    rules.push(table_rules);
                    prefix_files.push(prefix_file);
                }
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        pipeline.check().map_err(|e| {
            let i = names.iter().position(|n| *n == e.table).unwrap_or(0);
            vec![(format!("fastpath.table[{i}]"), e.reason)]
        })?;
        Ok(FastpathConfig {
            pipeline,
            rules,
            prefix_files,
            mode,
            threads,
            recirculation,
        })
    }
}

/// Table `i` of the pipeline whose tables are `names`: the table, its inline rules, its file
/// of prefixes. The error is the dotted key and the reason.
#[allow(clippy::type_complexity)]
fn table(
    i: usize,
    t: &TableToml,
    names: &[&str],
) -> Result<(Table, TableRules, Option<PrefixFile>), (String, String)> {
    let at = |k: &str| format!("fastpath.table[{i}].{k}");
    let kind = match t.kind.as_str() {
        "exact" => Kind::Exact,
        "lpm" => Kind::Lpm,
        k => return Err((at("kind"), format!("{k:?}: expected \"exact\" or \"lpm\""))),
    };
    let key = field_list(&t.key).map_err(|r| (at("key"), r))?;
    let mut writes = fields(&t.writes).map_err(|r| (at("writes"), r))?;
    let branches = t
        .branches
        .iter()
        .map(|b| match b.as_str() {
            "end" => Ok(Next::End),
            name => names
                .iter()
                .position(|n| *n == name)
                .map(Next::Table)
                .ok_or_else(|| (at("branches"), format!("{name:?}: no such table"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let branch_of = |b: &Option<String>, key: String| -> Result<u8, (String, String)> {
        match b {
            None => Ok(0),
            Some(name) => t
                .branches
                .iter()
                .position(|x| x == name)
                .map(|p| p as u8)
                .ok_or_else(|| (key, format!("{name:?} is not in this table's branches"))),
        }
    };
    let rule_of = |r: &RuleToml, k: &dyn Fn(&str) -> String| -> Result<Rule, (String, String)> {
        if r.set.len() > Rule::MAX_WRITES {
            return Err((k("set"), format!("at most {} fields", Rule::MAX_WRITES)));
        }
        let mut rule = Rule {
            drop: r.drop,
            branch: branch_of(&r.branch, k("branch"))?,
            ..Rule::default()
        };
        for (slot, (name, v)) in rule.writes.iter_mut().zip(&r.set) {
            let f =
                Field::parse(name).ok_or_else(|| (k("set"), format!("{name:?}: no such field")))?;
            let v = value(f, v).map_err(|e| (k(&format!("set.{name}")), e))?;
            *slot = Some((f, v));
        }
        Ok(rule)
    };
    let default = match &t.default {
        Some(r) => {
            if r.key.is_some() {
                return Err((at("default.key"), "a default has no key".into()));
            }
            rule_of(r, &|k| at(&format!("default.{k}")))?
        }
        None => Rule::default(),
    };
    writes = writes.union(default.written());
    let mut table_rules = Vec::with_capacity(t.rules.len());
    for (j, r) in t.rules.iter().enumerate() {
        let k = |x: &str| at(&format!("rules[{j}].{x}"));
        let rule = rule_of(r, &k)?;
        let Some(kv) = &r.key else {
            return Err((k("key"), "missing".into()));
        };
        let key = match kind {
            Kind::Exact => exact_key(&key, kv),
            Kind::Lpm => kv
                .as_str()
                .ok_or("expected a prefix \"a.b.c.d/len\"".to_owned())
                .and_then(prefix)
                .map(|p| p.key()),
        }
        .map_err(|e| (k("key"), e))?;
        if !writes.contains(rule.written()) {
            return Err((
                k("set"),
                "writes a field not in the table's `writes`".into(),
            ));
        }
        table_rules.push((key, rule));
    }
    let prefix_file = match &t.prefixes {
        Some(path) => {
            if kind != Kind::Lpm {
                return Err((at("prefixes"), "only an lpm table reads prefixes".into()));
            }
            writes = writes.with(Field::Egress);
            Some(PrefixFile {
                path: PathBuf::from(path),
                next_hops: t.next_hops.unwrap_or(1).max(1),
            })
        }
        None if t.next_hops.is_some() => return Err((at("next_hops"), "needs `prefixes`".into())),
        None => None,
    };
    if table_rules.len() > MAX_RULES {
        return Err((at("rules"), format!("more than {MAX_RULES} rules")));
    }
    let on_miss = if t.balance.is_empty() {
        OnMiss::Default
    } else {
        if kind != Kind::Exact {
            return Err((at("balance"), "only an exact table balances".into()));
        }
        writes = writes.with(Field::DstIp).with(Field::DstPort);
        let backends = t
            .balance
            .iter()
            .map(|b| {
                b.parse::<SocketAddrV4>()
                    .map(|a| (u32::from(*a.ip()), a.port()))
                    .map_err(|_| (at("balance"), format!("{b:?}: expected \"a.b.c.d:port\"")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        OnMiss::Balance { backends }
    };
    let bloom = match &t.bloom {
        None => None,
        Some(b) => {
            let auto = BloomParams::sized(
                branches.len(),
                table_rules.len().max(1),
                b.fp.unwrap_or(0.01),
            );
            Some(BloomParams {
                filters: b.filters.unwrap_or(auto.filters),
                weight: b.weight.unwrap_or(auto.weight),
                bits: b.bits.unwrap_or(auto.bits),
                hashes: b.hashes.unwrap_or(auto.hashes),
            })
        }
    };
    Ok((
        Table {
            name: t.name.clone(),
            kind,
            key,
            cache: t.cache,
            default,
            branches,
            bloom,
            on_miss,
            writes,
        },
        table_rules,
        prefix_file,
    ))
}

fn field_list(names: &[String]) -> Result<Vec<Field>, String> {
    names
        .iter()
        .map(|n| Field::parse(n).ok_or_else(|| format!("{n:?}: no such field")))
        .collect()
}

fn fields(names: &[String]) -> Result<Fields, String> {
    Ok(field_list(names)?
        .into_iter()
        .fold(Fields::default(), Fields::with))
}

fn value(f: Field, v: &toml::Value) -> Result<u32, String> {
    let n = match v {
        toml::Value::Integer(i) if *i >= 0 => *i as u64,
        toml::Value::String(s) => {
            u64::from(u32::from(s.parse::<Ipv4Addr>().map_err(|_| {
                format!("{s:?}: expected a number or an IPv4 address")
            })?))
        }
        other => return Err(format!("expected a number or an address, got {other}")),
    };
    if !f.fits(n) {
        return Err(format!("{n} does not fit the {}-bit field {f}", f.bits()));
    }
    Ok(n as u32)
}

/// An exact key: one value per key field, as an array or a comma-separated string.
fn exact_key(key: &[Field], v: &toml::Value) -> Result<u128, String> {
    let parts: Vec<toml::Value> = match v {
        toml::Value::Array(a) => a.clone(),
        toml::Value::String(s) => s
            .split(',')
            .map(|p| {
                let p = p.trim();
                p.parse::<i64>()
                    .map(toml::Value::Integer)
                    .unwrap_or_else(|_| toml::Value::String(p.to_owned()))
            })
            .collect(),
        toml::Value::Integer(_) => vec![v.clone()],
        other => {
            return Err(format!(
                "expected values for {} fields, got {other}",
                key.len()
            ))
        }
    };
    if parts.len() != key.len() {
        return Err(format!(
            "{} values for a key of {} fields",
            parts.len(),
            key.len()
        ));
    }
    let mut k = 0u128;
    for (f, p) in key.iter().zip(&parts) {
        k = k << f.bits() | u128::from(value(*f, p)?);
    }
    Ok(k)
}

/// A prefix `a.b.c.d/len` with its host bits zero ([`flowstate_config::parse_prefix_v4`]).
fn prefix(s: &str) -> Result<Prefix, String> {
    let n = flowstate_config::parse_prefix_v4(s)?;
    Ok(Prefix {
        addr: u32::from(n.network()),
        len: n.prefix_len(),
    })
}

/// A stable hash of a route's label (FNV-1a), choosing its next hop.
fn label_hash(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FastpathConfig, (String, String)> {
        let v: toml::Table = toml::from_str(text).unwrap();
        FastpathConfig::from_value(v["fastpath"].clone()).map_err(|mut e| e.remove(0))
    }

    #[test]
    fn a_pipeline_with_branches_rules_and_a_balancer() {
        let c = parse(
            r#"
            [fastpath]
            mode = "busy"
            [[fastpath.table]]
            name = "acl"
            kind = "exact"
            key = ["proto", "dst_port"]
            writes = ["mark"]
            branches = ["lb", "end"]
            bloom = { bits = 1024 }
            default = { branch = "end", drop = true }
            rules = [ { key = "6,80", set = { mark = 1 }, branch = "lb" }, { key = [17, 53], branch = "end" } ]
            [[fastpath.table]]
            name = "route"
            kind = "lpm"
            key = ["dst_ip"]
            writes = ["egress"]
            rules = [ { key = "10.0.0.0/8", set = { egress = 2 } } ]
            [[fastpath.table]]
            name = "lb"
            kind = "exact"
            key = ["src_ip", "dst_ip", "src_port", "dst_port", "proto"]
            balance = ["10.1.0.1:8080", "10.1.0.2:8080"]
            "#,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Busy);
        let p = &c.pipeline;
        assert_eq!(p.tables[0].branches, vec![Next::Table(2), Next::End]);
        assert_eq!(c.rules[0][0], (6u128 << 16 | 80, Rule::set(Field::Mark, 1)));
        assert_eq!(c.rules[0][1].1.branch, 1);
        assert!(p.tables[0].default.drop);
        assert_eq!(
            c.rules[1][0].0,
            Prefix {
                addr: 0x0a00_0000,
                len: 8
            }
            .key()
        );
        assert!(
            matches!(&p.tables[2].on_miss, OnMiss::Balance { backends } if backends.len() == 2)
        );
        assert!(p.tables[0].bloom.is_some());
    }

    #[test]
    fn errors_name_their_key() {
        let base =
            "[fastpath]\n[[fastpath.table]]\nname = \"a\"\nkind = \"exact\"\nkey = [\"proto\"]\n";
        let cases = [
            ("kind = \"trie\"", "fastpath.table[1].kind"),
            ("key = [\"ttl\"]", "fastpath.table[1].key"),
            (
                "rules = [ { key = \"1,2\" } ]",
                "fastpath.table[1].rules[0].key",
            ),
            (
                "rules = [ { key = \"300\" } ]",
                "fastpath.table[1].rules[0].key",
            ),
            (
                "rules = [ { key = \"6\", set = { mark = 1 } } ]",
                "fastpath.table[1].rules[0].set",
            ),
            ("branches = [\"nowhere\"]", "fastpath.table[1].branches"),
            ("branches = [\"a\"]", "fastpath.table[1]"),
            ("balance = [\"10.0.0.1\"]", "fastpath.table[1].balance"),
            ("colour = 1", "fastpath.table[1]"),
        ];
        for (extra, key) in cases {
            let kind = if extra.starts_with("kind") {
                ""
            } else {
                "kind = \"exact\"\n"
            };
            let key_line = if extra.starts_with("key") {
                ""
            } else {
                "key = [\"proto\"]\n"
            };
            let text = format!("{base}[[fastpath.table]]\nname = \"b\"\n{kind}{key_line}{extra}\n");
            let (k, reason) = parse(&text)
                .err()
                .unwrap_or_else(|| panic!("{extra} accepted"));
            assert_eq!(k, key, "{extra}: {reason}");
        }
        let lpm = "[fastpath]\n[[fastpath.table]]\nname = \"r\"\nkind = \"lpm\"\nkey = [\"dst_ip\"]\nwrites = [\"egress\"]\nrules = [ { key = \"10.0.0.1/8\", set = { egress = 1 } } ]\n";
        let (k, reason) = parse(lpm).err().unwrap();
        assert_eq!(k, "fastpath.table[0].rules[0].key");
        assert_eq!(
            reason,
            "10.0.0.1/8: host bits set; did you mean 10.0.0.0/8?"
        );
        assert_eq!(
            parse("[fastpath]\nmode = \"eager\"\n").err().unwrap().0,
            "fastpath.mode"
        );
        for bad in ["\"\"", "\"a-very-long-name\"", "\"fs rc\""] {
            let text = format!("[fastpath]\nrecirculation = {bad}\n{}", &base[11..]);
            assert_eq!(
                parse(&text).err().unwrap().0,
                "fastpath.recirculation",
                "{bad}"
            );
        }
        let text = format!("[fastpath]\nrecirculation = \"rc0\"\n{}", &base[11..]);
        assert_eq!(parse(&text).unwrap().recirculation, "rc0");
    }

    #[test]
    fn every_table_reports_its_error() {
        let text = "[fastpath]\nmode = \"eager\"\nthreads = 0\n[[fastpath.table]]\nname = \"a\"\nkind = \"exact\"\nkey = [\"proto\"]\n";
        let v: toml::Table = toml::from_str(text).unwrap();
        let keys: Vec<String> = FastpathConfig::from_value(v["fastpath"].clone())
            .unwrap_err()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["fastpath.mode", "fastpath.threads"]);
        let text = "[fastpath]\n[[fastpath.table]]\nname = \"a\"\nkind = \"trie\"\nkey = [\"proto\"]\n[[fastpath.table]]\nname = \"b\"\nkind = \"lpm\"\nkey = [\"dst_ip\"]\nrules = [ { key = \"10.0.0.1/8\" } ]\n";
        let v: toml::Table = toml::from_str(text).unwrap();
        let keys: Vec<String> = FastpathConfig::from_value(v["fastpath"].clone())
            .unwrap_err()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            ["fastpath.table[0].kind", "fastpath.table[1].rules[0].key"]
        );
    }
}
