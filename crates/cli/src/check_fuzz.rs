//! The stable harness of the `config` fuzz target (`fuzz/fuzz_targets/config.rs`): TOML text
//! through [`check::load`](crate::check::load), the path `flowstate check`, `run` and
//! `cluster up` load a file by. Inputs: the committed seed corpus (`fuzz/corpus/config`, the
//! examples and a few wrong files), mutated two ways: as bytes, as libFuzzer would (mostly
//! syntax errors), and as TOML (values replaced by values of other keys and by edge values,
//! keys dropped, unknown keys added, tables emptied), which reaches every section's checks.
//!
//! Nothing may panic; an error names the file; when the text is TOML every error names a key
//! and a line of the file (a syntax error is the one error without a key); loading twice
//! gives the same errors in the same order; a file that loads has a summary.
//!
//! `FLOWSTATE_FUZZ_CASES=100000 cargo test --release -p flowstate check_fuzz` (or
//! `scripts/fuzz`) runs it longer.

#[path = "../../../fuzz/harness/config_check.rs"]
mod config_check;
#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;

use crate::check;
use proptest::prelude::*;
use proptest::sample::Index;
use std::sync::OnceLock;

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| mutate::seeds(env!("CARGO_MANIFEST_DIR"), "config"))
}

/// The seeds as TOML tables (the ones that parse).
fn tables() -> &'static [toml::Table] {
    static TABLES: OnceLock<Vec<toml::Table>> = OnceLock::new();
    TABLES.get_or_init(|| {
        seeds()
            .iter()
            .filter_map(|(_, b)| std::str::from_utf8(b).ok()?.parse().ok())
            .collect()
    })
}

/// Every value of every seed (each leaf and each table and array), and edge values.
fn values() -> &'static [toml::Value] {
    static VALUES: OnceLock<Vec<toml::Value>> = OnceLock::new();
    VALUES.get_or_init(|| {
        fn walk(v: &toml::Value, out: &mut Vec<toml::Value>) {
            out.push(v.clone());
            match v {
                toml::Value::Table(t) => t.values().for_each(|v| walk(v, out)),
                toml::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        for t in tables() {
            t.values().for_each(|v| walk(v, &mut out));
        }
        use toml::Value::*;
        out.extend([
            String(std::string::String::new()),
            String("0".into()),
            String("0s".into()),
            String("-1s".into()),
            String("18446744073709551616s".into()),
            String("1e400s".into()),
            String("0.0.0.0/0".into()),
            String("10.0.0.0/33".into()),
            String("::/129".into()),
            String("255.255.255.255".into()),
            String("65535-1024".into()),
            String("0-0".into()),
            String("1-65536".into()),
            String("127.0.0.1:0".into()),
            String("[::1]:99999".into()),
            String("redis://".into()),
            String("é\u{0}\u{202e}".into()),
            Integer(0),
            Integer(-1),
            Integer(i64::MAX),
            Integer(i64::MIN),
            Integer(65_536),
            Integer(4_294_967_296),
            Float(f64::NAN),
            Float(f64::INFINITY),
            Float(-0.0),
            Float(1e300),
            Boolean(true),
            Array(Vec::new()),
            Table(toml::Table::new()),
        ]);
        out
    })
}

/// One structural edit of a TOML document.
#[derive(Debug, Clone)]
enum Edit {
    /// Replace the value at a path with a value from [`values`].
    Replace(Index, Index),
    /// Remove the key at a path.
    Remove(Index),
    /// Add a key (a known key name from elsewhere, or an unknown one) with a value.
    Add(Index, Index, Index),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let e = prop_oneof![
        3 => (any::<Index>(), any::<Index>()).prop_map(|(p, v)| Edit::Replace(p, v)),
        1 => any::<Index>().prop_map(Edit::Remove),
        1 => (any::<Index>(), any::<Index>(), any::<Index>()).prop_map(|(p, k, v)| Edit::Add(p, k, v)),
    ];
    proptest::collection::vec(e, 1..5)
}

/// A step into a table (by key) or an array (by index).
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    At(usize),
}

/// Paths to every value of `t` (tables and arrays included).
fn paths(t: &toml::Table) -> Vec<Vec<Step>> {
    fn walk(v: &toml::Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        out.push(here.clone());
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    here.push(Step::Key(k.clone()));
                    walk(v, here, out);
                    here.pop();
                }
            }
            toml::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    here.push(Step::At(i));
                    walk(v, here, out);
                    here.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut here = Vec::new();
    for (k, v) in t {
        here.push(Step::Key(k.clone()));
        walk(v, &mut here, &mut out);
        here.pop();
    }
    out
}

/// The value at `path` in `root` (a table wrapped as a value).
fn at<'a>(root: &'a mut toml::Value, path: &[Step]) -> Option<&'a mut toml::Value> {
    let mut v = root;
    for s in path {
        v = match (s, v) {
            (Step::Key(k), toml::Value::Table(t)) => t.get_mut(k)?,
            (Step::At(i), toml::Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

/// `table` with `edits` applied, as TOML text.
fn apply(table: &toml::Table, edits: &[Edit]) -> String {
    let mut root = toml::Value::Table(table.clone());
    let names: Vec<String> = paths(table)
        .into_iter()
        .filter_map(|p| match p.last() {
            Some(Step::Key(k)) => Some(k.clone()),
            _ => None,
        })
        .chain(["no_such_key".to_owned(), "chain".to_owned()])
        .collect();
    for e in edits {
        let Some(toml::Value::Table(t)) = Some(&root) else {
            break;
        };
        let ps = paths(t);
        if ps.is_empty() {
            break;
        }
        match e {
            Edit::Replace(p, v) => {
                let vals = values();
                if let Some(slot) = at(&mut root, &ps[p.index(ps.len())]) {
                    *slot = vals[v.index(vals.len())].clone();
                }
            }
            Edit::Remove(p) => {
                let path = &ps[p.index(ps.len())];
                let (last, parent) = path.split_last().expect("a path has a step");
                match (at(&mut root, parent), last) {
                    (Some(toml::Value::Table(t)), Step::Key(k)) => {
                        t.remove(k);
                    }
                    (Some(toml::Value::Array(a)), Step::At(i)) if *i < a.len() => {
                        a.remove(*i);
                    }
                    _ => {}
                }
            }
            Edit::Add(p, k, v) => {
                let vals = values();
                let path = &ps[p.index(ps.len())];
                let key = names[k.index(names.len())].clone();
                match at(&mut root, path) {
                    Some(toml::Value::Table(t)) => {
                        t.insert(key, vals[v.index(vals.len())].clone());
                    }
                    Some(toml::Value::Array(a)) => a.push(vals[v.index(vals.len())].clone()),
                    _ => {}
                }
            }
        }
    }
    // A value TOML cannot write (none that parsed) would come back as an error: keep the
    // text of what was there.
    toml::to_string(&root).unwrap_or_default()
}

/// What the fuzz target checks, on one file.
fn one(text: &[u8]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    config_check::check(&dir.path().join("fuzz.toml"), text);
}

/// Every seed loads or fails as its name says (`bad_*` fail).
#[test]
fn seeds_load_as_named() {
    for (name, text) in seeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let result = check::load(&path);
        if name.starts_with("bad_") {
            assert!(result.is_err(), "{name} loads");
        }
        one(text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(mutate::cases(300)))]

    #[test]
    fn fuzz_config_mutated_text(seed in any::<Index>(), edits in mutate::edits(6)) {
        let all = seeds();
        one(&mutate::apply(&all[seed.index(all.len())].1, &edits, all));
    }

    #[test]
    fn fuzz_config_mutated_toml(seed in any::<Index>(), edits in edits()) {
        let all = tables();
        one(apply(&all[seed.index(all.len())], &edits).as_bytes());
    }
}
