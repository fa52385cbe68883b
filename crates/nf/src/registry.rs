//! Builds an [`NfFactory`] from its name and its `[[chain]]` table in the configuration.

use crate::{BuildError, NfFactory};
use std::sync::Arc;

type Builder = fn(&toml::Table) -> Result<Arc<dyn NfFactory>, BuildError>;

/// The built-in NFs by name.
const BUILT_IN: &[(&str, Builder)] = &[
    ("counter", crate::counter::factory),
    ("firewall", crate::firewall::factory),
    ("ips", crate::ips::factory),
    ("lb", crate::lb::factory),
    ("monitor", crate::monitor::factory),
    ("nat", crate::nat::mvt::select_factory),
    ("portscan", crate::portscan::factory),
    ("trojan", crate::trojan::factory),
];

/// Names of the built-in NFs.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILT_IN.iter().map(|(n, _)| *n)
}

/// The factory of NF `name`, configured by `table` (the `[[chain]]` entry without `nf`).
pub fn factory(name: &str, table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    match BUILT_IN.iter().find(|(n, _)| *n == name) {
        Some((_, build)) => build(table),
        None => Err(BuildError::config(
            "chain",
            "nf",
            format!(
                "unknown NF {name:?}; known: {}",
                names().collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}
