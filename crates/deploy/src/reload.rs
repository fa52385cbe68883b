//! Reloading a live box's configuration file (`SIGHUP`, `flowstate reload ADDR`): the file is
//! read again and checked whole; the keys its NFs can change in place
//! ([`NfFactory::reloadable`]: the firewall's rules, policies and timeouts, the LB's VIPs and
//! backends, the IPS's rules, whose files are read again every time, the NAT's forwardings
//! and timeouts) reach every worker without losing an entry of any table; the dispatcher of
//! a box with several workers steers by the new configuration.
//!
//! Promises:
//! * A file with errors is refused with every one of them; so is a change of anything that
//!   needs a restart (a section other than `[[chain]]`, the NFs or their order, an NF's
//!   key it cannot change in place), each named. A refused reload changes nothing: the box
//!   goes on with the configuration it runs.
//! * Reloads are serialized; each is checked against the configuration running, the last one
//!   that went through.

use crate::config::Config;
use flowstate_chain::reload::Reload;
use flowstate_nf::NfFactory;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Reloads one box's configuration file.
pub struct Reloader {
    path: PathBuf,
    /// The running configuration's file, parsed.
    running: Mutex<toml::Table>,
    /// What the workers run, and where reloads go to them.
    reload: Arc<Reload>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .field("reload", &self.reload)
            .finish_non_exhaustive()
    }
}

/// A reload that went through.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reloaded {
    /// The NFs whose configuration changed (`firewall (chain[0])`); empty: the file changed
    /// nothing.
    pub changed: Vec<String>,
    /// Reloads applied since the box started.
    pub generation: u64,
}

impl Reloader {
    /// A reloader of `config`, the box's running configuration, which its file's `text`
    /// gave; the workers (a runtime started with `reload`) take what it publishes.
    pub fn new(config: &Config, text: &str, reload: Arc<Reload>) -> Result<Reloader, Vec<String>> {
        Ok(Reloader {
            path: config.file.clone(),
            running: Mutex::new(parse_table(&config.file, text)?),
            reload,
        })
    }

    /// The file it reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again and applies what may change in place; every error otherwise.
    pub fn reload(&self) -> Result<Reloaded, Vec<String>> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let text = flowstate_config::read_text(&self.path)
            .map_err(|e| vec![format!("{}: cannot read: {e}", self.path.display())])?;
        let config = Config::parse(&text, &self.path)
            .map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        let factories = config
            .factories()
            .map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        let new = parse_table(&self.path, &text)?;
        let at = |why: Vec<String>| -> Vec<String> {
            why.iter()
                .map(|w| format!("{}: {w}", self.path.display()))
                .collect()
        };
        let changed = changes(&running, &new, &factories).map_err(at)?;
        let workers = self.reload.running();
        if workers.len() != changed.len() {
            return Err(at(vec!["the box is still starting: reload again".into()]));
        }
        let mut names = Vec::new();
        let mut configs = vec![None; changed.len()];
        let mut why = Vec::new();
        for (i, f) in factories.iter().enumerate() {
            if !changed[i] && !f.reload_rereads() {
                continue;
            }
            match f.reload_config(workers[i].as_ref()) {
                Ok(None) => {}
                Ok(c) => {
                    names.push(format!("{} (chain[{i}])", f.name()));
                    configs[i] = c;
                }
                Err(e) => why.push(format!("chain[{i}] ({}): {e}", f.name())),
            }
        }
        if !why.is_empty() {
            return Err(at(why));
        }
        if !names.is_empty() {
            // Steered as the workers run: by each NF's configuration after this reload.
            let steering: Vec<Arc<dyn NfFactory>> = factories
                .iter()
                .zip(configs.iter().zip(&workers))
                .map(|(f, (new, running))| {
                    new.as_ref()
                        .or(running.as_ref())
                        .and_then(|c| f.steering(c))
                        .unwrap_or_else(|| Arc::clone(f))
                })
                .collect();
            self.reload.publish(configs, &steering);
        }
        *running = new;
        Ok(Reloaded {
            changed: names,
            generation: self.reload.generation(),
        })
    }
}

fn parse_table(path: &Path, text: &str) -> Result<toml::Table, Vec<String>> {
    toml::from_str(text).map_err(|e| vec![format!("{}: {e}", path.display())])
}

/// Which NFs of the chain `new` changes from `old` (by position), when everything it changes
/// may change in place (`factories`: the running chain's); otherwise what needs a restart.
fn changes(
    old: &toml::Table,
    new: &toml::Table,
    factories: &[Arc<dyn NfFactory>],
) -> Result<Vec<bool>, Vec<String>> {
    const RESTART: &str = "cannot change without a restart";
    let mut why: Vec<String> = differing(old, new)
        .filter(|k| *k != "chain")
        .map(|k| format!("[{k}]: {RESTART}"))
        .collect();
    let entries = |t: &toml::Table| -> Vec<toml::Table> {
        t.get("chain")
            .and_then(toml::Value::as_array)
            .map(|a| a.iter().filter_map(|e| e.as_table().cloned()).collect())
            .unwrap_or_default()
    };
    let (old, new) = (entries(old), entries(new));
    let nf = |t: &toml::Table| t.get("nf").cloned();
    if old.len() != new.len() || old.iter().zip(&new).any(|(a, b)| nf(a) != nf(b)) {
        why.push(format!(
            "chain: the NFs and their order {RESTART} (adding, removing or reordering one)"
        ));
        return Err(why);
    }
    let mut changed = vec![false; old.len()];
    for (i, ((a, b), f)) in old.iter().zip(&new).zip(factories).enumerate() {
        for k in differing(a, b) {
            if f.reloadable().contains(&k.as_str()) {
                changed[i] = true;
            } else {
                why.push(format!("chain[{i}].{k} ({}): {RESTART}", f.name()));
            }
        }
    }
    if why.is_empty() {
        Ok(changed)
    } else {
        Err(why)
    }
}

/// The keys whose values differ between `a` and `b` (in one only, or in both with other
/// values), in order.
fn differing<'t>(a: &'t toml::Table, b: &'t toml::Table) -> impl Iterator<Item = &'t String> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| a.get(*k) != b.get(*k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    fn firewall_chain() -> Vec<Arc<dyn NfFactory>> {
        vec![flowstate_nf::firewall::factory(&toml::Table::new()).unwrap()]
    }

    const BOX: &str = "[runtime]\nworkers = 2\n[[chain]]\nnf = \"firewall\"\n";

    #[test]
    fn rules_change_in_place_and_the_rest_is_named() {
        let f = firewall_chain();
        let old = table(BOX);
        let rules = table(&format!(
            "{BOX}default_inbound = \"allow\"\nrules = [{{ action = \"deny\", dport = 22 }}]\n"
        ));
        assert_eq!(changes(&old, &rules, &f), Ok(vec![true]));
        assert_eq!(changes(&old, &old, &f), Ok(vec![false]));
        let why = changes(
            &old,
            &table(&format!("{BOX}max_connections = 10\n").replace("workers = 2", "workers = 3")),
            &f,
        )
        .unwrap_err();
        assert_eq!(
            why,
            [
                "[runtime]: cannot change without a restart",
                "chain[0].max_connections (firewall): cannot change without a restart"
            ]
        );
        let why =
            changes(&old, &table(&format!("{BOX}[[chain]]\nnf = \"nat\"\n")), &f).unwrap_err();
        assert!(
            why[0].starts_with("chain: the NFs and their order"),
            "{why:?}"
        );
    }

    /// A NAT's forwardings and timeouts change in place; its pools do not.
    #[test]
    fn a_nat_reloads_forwardings_and_timeouts_but_not_its_pools() {
        let nat = "[[chain]]\nnf = \"nat\"\nexternal = [\"203.0.113.1\"]\n";
        let f = vec![flowstate_nf::registry::factory(
            "nat",
            &table(&nat.replace("[[chain]]\nnf = \"nat\"\n", "")),
        )
        .unwrap()];
        let old = table(nat);
        let new = table(&format!(
            "{nat}udp = \"1m\"\nforward = [{{ proto = \"tcp\", external = \"203.0.113.1:80\", internal = \"10.0.0.2:8080\" }}]\n"
        ));
        assert_eq!(changes(&old, &new, &f), Ok(vec![true]));
        let pools = table(&format!("{nat}ports = \"2000-3000\"\n"));
        assert_eq!(
            changes(&old, &pools, &f),
            Err(vec![
                "chain[0].ports (nat): cannot change without a restart".to_string()
            ])
        );
    }

    /// The file read again: a good change is published to the workers, a broken file is
    /// refused with its key and leaves the running configuration (and the workers) alone.
    #[test]
    fn a_reloader_publishes_good_files_and_refuses_broken_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("box.toml");
        let base =
            "[input]\nsynthetic = { flows = 10, packets = 100 }\n[[chain]]\nnf = \"firewall\"\n";
        std::fs::write(&path, base).unwrap();
        let config = Config::parse(base, &path).unwrap();
        let reload = Arc::new(Reload::default());
        let r = Reloader::new(&config, base, Arc::clone(&reload)).unwrap();
        assert_eq!(
            r.reload().unwrap_err(),
            [format!(
                "{}: the box is still starting: reload again",
                path.display()
            )]
        );
        reload.start(&config.factories().unwrap());
        assert_eq!(r.reload().unwrap().changed, Vec::<String>::new());
        assert_eq!(reload.generation(), 0, "nothing changed: nothing published");
        let deny = format!("{base}rules = [{{ action = \"deny\", dport = 22 }}]\n");
        std::fs::write(&path, &deny).unwrap();
        assert_eq!(
            r.reload().unwrap(),
            Reloaded {
                changed: vec!["firewall (chain[0])".into()],
                generation: 1
            }
        );
        std::fs::write(&path, deny.replace("deny", "maybe")).unwrap();
        let why = r.reload().unwrap_err();
        assert!(
            why.len() == 1
                && why[0].contains(
                    "box.toml:5: chain[0].firewall.rules[0].action: unknown variant `maybe`"
                ),
            "{why:?}"
        );
        std::fs::write(&path, deny.replace("flows = 10", "flows = 20")).unwrap();
        let why = r.reload().unwrap_err();
        assert!(
            why[0].ends_with("[input]: cannot change without a restart"),
            "{why:?}"
        );
        assert_eq!(reload.generation(), 1);
        // Checked against the last reload that went through: the same file changes nothing.
        std::fs::write(&path, &deny).unwrap();
        assert_eq!(r.reload().unwrap().changed, Vec::<String>::new());
    }

    /// An IPS's rule file rewritten under an unchanged configuration file: read again and
    /// published; read again unchanged: nothing.
    #[test]
    fn rule_files_are_read_again_at_every_reload() {
        let dir = tempfile::tempdir().unwrap();
        let (path, rules) = (dir.path().join("box.toml"), dir.path().join("t.rules"));
        let rule =
            |sid| format!("alert tcp any any -> any 80 (msg:\"x\"; content:\"x\"; sid:{sid};)\n");
        std::fs::write(&rules, rule(1)).unwrap();
        let text = format!(
            "[input]\nsynthetic = {{ flows = 10, packets = 100 }}\n[[chain]]\nnf = \"ips\"\nrules = [{:?}]\n",
            rules.to_str().unwrap()
        );
        std::fs::write(&path, &text).unwrap();
        let config = Config::parse(&text, &path).unwrap();
        let reload = Arc::new(Reload::default());
        reload.start(&config.factories().unwrap());
        let r = Reloader::new(&config, &text, Arc::clone(&reload)).unwrap();
        assert_eq!(r.reload().unwrap().changed, Vec::<String>::new());
        std::fs::write(&rules, rule(2)).unwrap();
        assert_eq!(r.reload().unwrap().changed, ["ips (chain[0])"]);
        assert_eq!(r.reload().unwrap().changed, Vec::<String>::new());
        assert_eq!(reload.generation(), 1);
    }
}
